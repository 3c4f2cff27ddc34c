"""EnvACE-Lab: a procedurally generated warehouse tool world where world rehearsal can be seen and measured
on 2 CPU cores, behind the same suite interface as BFCL (registered as suite ``lab``).

Two rule sets: suite ``lab`` (hidden rules, v1, the default; `benchmarks.lab.hidden`) and ``lab-stated``
(rules stated in the prompt; `benchmarks.lab.tasks`); suite ``lab-told`` is ``lab`` with the rules' facts of
each task's initial state told in the prompt (``LabConfig(told=True)``), ``lab-blind`` is ``lab`` without the
tools that only look (``LabConfig(blind=True)``). ``CATEGORIES`` are the stated world's
families; a suite's own are ``LabSuite(...).categories``.

* `benchmarks.lab.world`: the state, the tools and their rules (`LabBackend`, the real backend).
* `benchmarks.lab.hidden`: the hidden-rules families and splits; `benchmarks.lab.properties` their numbers.
* `benchmarks.lab.tasks`: task families, difficulty knobs (`LabConfig`) and generation from a seed.
* `benchmarks.lab.suite`: `LabSuite` (tasks, backends, reference solutions, the replay verifier).
"""

from benchmarks.lab.suite import LabSuite
from benchmarks.lab.tasks import CATEGORIES, LabConfig

__all__ = ["LabSuite", "LabConfig", "CATEGORIES"]
