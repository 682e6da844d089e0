"""A local data file's rows as problems (``[task] kind = "dataset"``, ``teamtr eval --data``):
the file found beside the config, its format told by its suffix, read through Hugging Face
``datasets`` (``load_dataset(<format>, data_files=...)``, local files only), its columns mapped
by ``question_column``, ``answer_column`` and ``notes_columns``, and every row checked. Each
error is one line naming the key, the file and the row's place as an editor shows it
(``file:LINE``).
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from llm.common.config import ConfigError, TaskSettings
from llm.problems.task import first_line
from llm.problems.tasks import Problem, TaskDataError

DATA_FORMATS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
"""File suffix -> the ``datasets`` builder that reads it."""


def data_path(name: str, directory: str) -> Path:
    """A data file named in a config: absolute, or relative to ``directory`` (the config's
    folder) where it exists there, else to the working directory."""
    path = Path(name)
    if not path.is_absolute() and directory and (Path(directory) / path).exists():
        return Path(directory) / path
    return path


def read_problems(settings: TaskSettings, name: str, key: str) -> list[Problem]:
    """The rows of a local data file as problems (``datasets.load_dataset``)."""
    path = data_path(name, settings.directory)
    if not path.is_file():
        # Where it was looked for, in full: a relative name is read beside the config, else
        # from the working directory, and "no such file" alone does not say which.
        beside = [Path(settings.directory) / name] if settings.directory else []
        looked = dict.fromkeys(str(p.resolve()) for p in [*beside, path])
        raise TaskDataError(f"{key}: {name}: no such file (looked for {' and '.join(looked)})")
    data_format = settings.data_format or DATA_FORMATS.get(path.suffix.lower())
    if data_format is None:
        raise ConfigError(
            f"{key}: {path}: cannot tell the format from the suffix {path.suffix!r}; set "
            f"[task] data_format to one of {sorted(set(DATA_FORMATS.values()))}"
        )
    nothing = _holds_no_rows(path, data_format)
    if nothing:
        raise TaskDataError(f"{key}: {path}: {nothing}")
    rows = _load_rows(path, data_format, key)
    columns = list(rows.column_names)
    wanted = [settings.question_column, *settings.notes_columns]
    if settings.answer_column:
        wanted.append(settings.answer_column)
    for column in wanted:
        if column not in columns:
            raise TaskDataError(
                f"{key}: {path}: no column {column!r} (columns: {', '.join(columns)}); map the "
                "columns with [task] question_column, answer_column and notes_columns"
            )
    if len(rows) == 0:
        raise TaskDataError(f"{key}: {path}: no rows")
    places = row_places(path, data_format, len(rows))
    problems = []
    for place, row in zip(places, rows, strict=True):
        question = row[settings.question_column]
        if question is None:
            raise TaskDataError(f"{key}: {place}: no {settings.question_column!r} in this row")
        if not isinstance(question, str) or not question.strip():
            raise TaskDataError(
                f"{key}: {place}: {settings.question_column!r} must be non-empty text, got "
                f"{question!r:.40}"
            )
        answer = _answer_of(row, settings.answer_column, f"{key}: {place}")
        notes = tuple("" if row[c] is None else str(row[c]) for c in settings.notes_columns)
        metadata = {c: v for c, v in row.items() if c not in wanted}
        problems.append(
            Problem(question.strip(), answer, notes=notes, metadata=metadata, origin=place)
        )
    return problems


def _answer_of(row: dict[str, Any], column: str, where: str) -> str:
    """A row's reference answer: every row has one, unless the task says it has none
    (``answer_column = ""``: its reward needs no reference); GSM8K's "reasoning #### answer"
    is cut to the answer."""
    if not column:
        return ""
    answer = row[column]
    if answer is None or not str(answer).strip():
        missing = f"no {column!r} in this row" if answer is None else f"{column!r} is empty"
        raise TaskDataError(
            f"{where}: {missing}; every row needs an answer (for a task without reference "
            'answers, set [task] answer_column = "" and give a reward that needs none)'
        )
    answer = str(answer)
    if "####" in answer:  # GSM8K writes the reasoning, then "#### <final answer>"
        answer = answer.split("####")[-1]
    return answer.strip()


def _holds_no_rows(path: Path, data_format: str) -> str | None:
    """What an empty or header-only file holds, said before ``datasets`` reads it (which
    raises a generic DatasetGenerationError, or reads no split at all); None otherwise."""
    if path.stat().st_size == 0:
        return "the file is empty: no rows"
    if data_format not in ("json", "csv"):
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None  # the reader's own error says what is wrong
    if not text.strip():
        return "the file holds only blank lines: no rows"
    if data_format == "json" and text.strip() == "[]":
        return "the file holds an empty list: no rows"
    if data_format == "csv":
        with contextlib.suppress(csv.Error):
            records = [r for r in csv.reader(io.StringIO(text)) if r]
            if len(records) == 1:
                return f"the file holds a header ({', '.join(records[0])}) and no rows"
    return None


def row_places(path: Path, data_format: str, count: int) -> list[str]:
    """Where each of a data file's ``count`` rows was written, as a user's editor shows it:
    ``file:LINE`` (1-based) where rows are lines (JSONL, CSV with its header), else
    ``file row N`` (a JSON array, Parquet)."""
    lines: list[int] = []
    if data_format in ("json", "csv"):
        with contextlib.suppress(OSError, UnicodeDecodeError, csv.Error):
            text = path.read_text(encoding="utf-8")
            lines = _csv_record_lines(text) if data_format == "csv" else _jsonl_lines(text)
    if len(lines) == count:
        return [f"{path}:{line}" for line in lines]
    return [f"{path} row {index + 1}" for index in range(count)]


def _jsonl_lines(text: str) -> list[int]:
    """The 1-based lines of a JSONL file's objects (blank lines hold none); [] for a file
    that is not one object a line (a JSON array)."""
    numbered = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not all(line.lstrip().startswith("{") for _, line in numbered):
        return []
    return [n for n, _ in numbered]


def _csv_record_lines(text: str) -> list[int]:
    """The 1-based line on which each record after a CSV file's header starts (a quoted
    field may span lines; blank lines hold no record)."""
    reader = csv.reader(io.StringIO(text))
    starts: list[int] = []
    next_start = 1
    for record in reader:
        if record:
            starts.append(next_start)
        next_start = reader.line_num + 1
    return starts[1:]


def _load_rows(path: Path, data_format: str, key: str):
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local files only: never the hub
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            f'{key}: kind = "dataset" reads files with Hugging Face datasets: pip install datasets'
        ) from None
    with _quiet_datasets(datasets), tempfile.TemporaryDirectory() as cache:
        try:
            loaded = datasets.load_dataset(
                data_format, data_files=str(path), split="train", cache_dir=cache
            )
            return _Rows(loaded)
        except Exception as error:  # pyarrow and datasets raise many types on bad files
            text = first_line(error)
            raise TaskDataError(
                f"{key}: {path}: cannot be read as {data_format} ({type(error).__name__}: {text})"[
                    :400
                ]
            ) from None


class _Rows:
    """A loaded dataset's rows in memory (its cache folder is gone once it is read)."""

    def __init__(self, dataset: Any) -> None:
        self.column_names = list(dataset.column_names)
        self._rows = dataset.to_list()

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._rows)


@contextlib.contextmanager
def _quiet_datasets(datasets: ModuleType) -> Iterator[None]:
    """No progress bars or info lines from ``datasets`` while a small local file is read."""
    logging = datasets.utils.logging
    level = logging.get_verbosity()
    bars = datasets.utils.is_progress_bar_enabled()
    logging.set_verbosity_error()
    datasets.utils.disable_progress_bars()
    try:
        yield
    finally:
        logging.set_verbosity(level)
        if bars:
            datasets.utils.enable_progress_bars()
