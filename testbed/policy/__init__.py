"""Policy plugins: the interfaces they implement and how they are found."""

from testbed.policy.base import (
    Bubble,
    BubblePolicy,
    Option,
    Request,
    TrainingPolicy,
    Transfer,
    parse_options,
)
from testbed.policy.registry import bubble_policy, discover, training_policy

__all__ = [
    "Bubble",
    "BubblePolicy",
    "Option",
    "Request",
    "TrainingPolicy",
    "Transfer",
    "bubble_policy",
    "discover",
    "parse_options",
    "training_policy",
]
