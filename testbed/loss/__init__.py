"""Predicted loss against tokens: a synchronous scaling law, and what each method does to
the loss a token buys, every coefficient from a published source (testbed.loss.sources).
Pure: numbers in, numbers out; the simulator, the policies and the reports read it."""
