"""The paper's claims as data: the runs behind them, the design space searched for 'up to'
figures, what bounds each, their figures."""
