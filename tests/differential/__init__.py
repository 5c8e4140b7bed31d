"""Differential testing of the scoring engine (issue 44): small models drawn from a grammar
(:mod:`.recipes`), rows, preprocess functions and options drawn by Hypothesis
(:mod:`.strategies`), every case scored by the engine and checked against an oracle that
scores each row alone, the slow and obvious way (:mod:`.oracle`, :mod:`.harness`)."""
