"""The scheduler benchmark's parts (``components/scheduler/bench/run.py`` is its command): the
KWOK pool and both schedulers (:mod:`.pool`), the classic case's phases (:mod:`.phases`), the DRA
case (:mod:`.dra_case`), the PodGroup case (:mod:`.podgroup_case`)."""
