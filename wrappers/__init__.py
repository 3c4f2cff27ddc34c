"""Gymnasium wrappers for the EnvACE environments, one concern each."""

from wrappers.real_tools import RealTools
from wrappers.record_trajectories import RecordTrajectories

__all__ = ["RealTools", "RecordTrajectories"]
