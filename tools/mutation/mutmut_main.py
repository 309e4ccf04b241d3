"""``mutmut`` for ``make mutation``, with three of its fixed costs cut; what it decides is the same.

Run as ``python -m tools.mutation.mutmut_main run ...`` (the arguments of ``mutmut``). Measured
on a whole run of 7,588 mutants on 2 cores (docs/testing.md):

- **Type errors are mapped to mutants with ``ast``, not ``libcst``.** mutmut's type check runs
  mypy once (about 30 s), then parses every mutated file with libcst and its position metadata
  to find which generated function holds each error: about 3 minutes of one core, for line
  ranges that ``ast`` gives in a second. The mapping (which ``x_...__mutmut_N`` function's
  lines hold the error) is unchanged, and an error outside every mutant is still an error.
- **The status line is recomputed at most every ``STATUS_EVERY_S``.** mutmut recounts all
  mutants after each one, in the parent process that shares the 2 cores with the workers.
- **A file's results are written with the C JSON encoder.** mutmut rewrites a source file's
  results (every mutant of it, indented) after each mutant, which ``json.dump`` does in pure
  Python. The content is the same; only the indentation is gone.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import mutmut.__main__ as mutmut_main
from mutmut.configuration import config
from mutmut.mutation.data import SourceFileMutationData
from mutmut.mutation.file_mutation import (
    FailedTypeCheckMutant,
    MutatedMethodLocation,
    group_by_path,
)
from mutmut.stats import print_stats
from mutmut.type_checking import run_type_checker
from mutmut.utils.file_utils import change_cwd
from mutmut.utils.format_utils import get_mutant_name
from mutmut.workers.isolation import ForkRunner
from tools.mutation.type_map import function_at, mutated_functions

STATUS_EVERY_S = 1.0


def filter_mutants_with_type_checker() -> dict[str, FailedTypeCheckMutant]:
    """mutmut's function of the same name, with the ``ast`` mapping."""
    with change_cwd(Path("mutants")):
        errors = run_type_checker(config().type_check_command)
        caught: dict[str, FailedTypeCheckMutant] = {}
        for path, errors_of_file in group_by_path(errors).items():
            functions = mutated_functions(path.read_text(encoding="utf-8"))
            if not functions:
                continue
            for error in errors_of_file:
                found = function_at(functions, error.line_number)
                if found is None:
                    raise RuntimeError(
                        f"type error outside every mutant: {error.file_path}:{error.line_number}"
                        f" ({error.error_description}); the unmutated code must type-check"
                    )
                location = MutatedMethodLocation(path, *found)
                name = get_mutant_name(path.relative_to(Path(".").absolute()), found[0])
                caught[name] = FailedTypeCheckMutant(location, name, error)
        return caught


class ThrottledStatus:
    """Calls mutmut's ``print_stats`` at most every ``every_s``, and always when forced."""

    def __init__(self, every_s: float) -> None:
        self._print = print_stats
        self._every_s = every_s
        self._last = float("-inf")

    def __call__(
        self,
        source_file_mutation_data_by_path: dict[str, SourceFileMutationData],
        force_output: bool = False,
    ) -> None:
        now = time.monotonic()
        if force_output or now - self._last >= self._every_s:
            self._last = now
            self._print(source_file_mutation_data_by_path, force_output=force_output)


def save_results(self: SourceFileMutationData) -> None:
    content: dict[str, Any] = {
        "exit_code_by_key": self.exit_code_by_key,
        "hash_by_function_name": self.hash_by_function_name,
        "type_check_error_by_key": self.type_check_error_by_key,
        "durations_by_key": self.durations_by_key,
        "estimated_durations_by_key": self.estimated_time_of_tests_by_mutant,
    }
    Path(self.meta_path).write_text(json.dumps(content))


class OnePassingRun:
    """Skips mutmut's clean run when its statistics run passed in this same process.

    A fresh run first runs the whole selection traced (the statistics: which test reaches which
    function), and fails if any test fails; then it runs the tests of the selected mutants again,
    untraced, to see them pass: the same tests on the same code, about 2 minutes. mutmut's
    default runner (``process_isolation = "fork"``, ours) runs both in its own process, and
    every mutant is forked from it. After a
    passing statistics run that second pass is skipped; when mutmut loads statistics from an
    earlier run (``mutmut run NAME...`` in an existing ``mutants/``), the clean run happens.
    """

    def __init__(self) -> None:
        self.stats_passed = False
        self._collect = ForkRunner.collect_stats
        self._clean = ForkRunner.run_clean_tests

    def install(self) -> None:
        def collect_stats(runner: ForkRunner, tests: Iterable[str] | None) -> int:
            exit_code = self._collect(runner, tests)
            self.stats_passed = exit_code == 0 and not tests  # all of the selection
            return exit_code

        def run_clean_tests(runner: ForkRunner, tests: Iterable[str]) -> int:
            if self.stats_passed:
                return 0
            return self._clean(runner, tests)

        ForkRunner.collect_stats = collect_stats  # type: ignore[method-assign,assignment]
        ForkRunner.run_clean_tests = run_clean_tests  # type: ignore[method-assign,assignment]


def main() -> None:
    # mutmut.__main__ imported these by name: its own references are the ones to replace.
    mutmut_main.filter_mutants_with_type_checker = filter_mutants_with_type_checker  # type: ignore[attr-defined]
    mutmut_main.print_stats = ThrottledStatus(STATUS_EVERY_S)  # type: ignore[attr-defined]
    SourceFileMutationData.save = save_results  # type: ignore[method-assign]
    OnePassingRun().install()
    sys.argv[0] = "mutmut"
    mutmut_main.cli()


if __name__ == "__main__":
    main()
