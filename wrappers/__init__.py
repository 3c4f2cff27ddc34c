"""Gymnasium wrappers for the EnvACE environments, one concern each."""

from wrappers.real_tools import RealTools
from wrappers.record_trajectories import RecordTrajectories

__all__ = ["RealTools", "RecordTrajectories"]
from wrappers.fidelity import RehearsalFidelity  # noqa: E402
from wrappers.test_time_rehearsal import TestTimeRehearsal  # noqa: E402

__all__ += ["TestTimeRehearsal", "RehearsalFidelity"]
