"""The metric a report compares and which way is better (`report --lower-is-better`): one small
object, made once by build_report and carried by the evidence (report/evidence.py), so that
whatever compares two numbers asks it instead of being handed a flag."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """A metric's name and direction."""
    name: str = "eval/accuracy"
    higher_is_better: bool = True

    @property
    def sign(self) -> float:
        """+1 when higher is better, −1 when lower is: a difference times the sign is > 0 when better."""
        return 1.0 if self.higher_is_better else -1.0

    @property
    def direction(self) -> str:
        """"higher" or "lower": which is better, in words."""
        return "higher" if self.higher_is_better else "lower"

    def better(self, difference: float) -> bool:
        """Whether a difference (this − that) points the better way: (difference > 0) == higher_is_better."""
        return (difference > 0) == self.higher_is_better

    def worse(self, difference: float) -> bool:
        """Whether a difference (this − that) lies strictly on the worse side of zero."""
        return (difference < 0) if self.higher_is_better else (difference > 0)
