"""``Check``: the outcome of one readiness check (the doctor's line, and what to do about it).

Standard library only, like everything the doctor imports before it knows the course's packages
are installed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    """The outcome of one doctor check: ``fix`` says what to do when ``ok`` is False.

    A ``warning`` is a check that passed (``ok`` stays True, so the doctor's exit status is 0) but
    found something that costs part of the course or its speed; its line starts with ``WARN``.
    """

    name: str
    ok: bool
    detail: str
    fix: str = ""
    warning: bool = False

    @classmethod
    def warn(cls, name: str, detail: str, fix: str) -> Check:
        """Return a passing check that warns: ``detail`` says what is wrong, ``fix`` what to do."""
        return cls(name, True, detail, fix, warning=True)

    def line(self) -> str:
        """Return the check as one printable line."""
        if not self.ok:
            return f"FAIL  {self.name}: {self.detail}. Fix: {self.fix}"
        if self.warning:
            return f"WARN  {self.name}: {self.detail}. Fix: {self.fix}"
        return f"ok    {self.name}: {self.detail}"
