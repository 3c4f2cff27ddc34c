"""EnvACE-Lab: a procedurally generated warehouse tool world where world rehearsal can be seen and measured
on 2 CPU cores, behind the same suite interface as BFCL (registered as suite ``lab``).

* `benchmarks.lab.world`: the state, the tools and their rules (`LabBackend`, the real backend).
* `benchmarks.lab.tasks`: task families, difficulty knobs (`LabConfig`) and generation from a seed.
* `benchmarks.lab.suite`: `LabSuite` (tasks, backends, reference solutions, the replay verifier).
"""

from benchmarks.lab.suite import LabSuite
from benchmarks.lab.tasks import CATEGORIES, LabConfig

__all__ = ["LabSuite", "LabConfig", "CATEGORIES"]
