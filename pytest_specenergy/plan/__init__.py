"""A suite's GPU time before it runs: the steady window's end rule (``window.py``), each case's
modeled GPU minutes from the modeled meter's pricing (``cost.py``), and the budget a suite must fit
(``budget.py``)."""
