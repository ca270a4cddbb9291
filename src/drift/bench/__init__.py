"""``drift bench``: the DRIFT paper's evaluation (section VI) on local ranks; see ``drift.bench.cli``."""
