"""BubbleTea: inference prefill inside training bubbles."""
