"""Question/answer records for the QA environment, through a `tensorflow-datasets` builder.

    records = load_records(path="metamathqa.jsonl", data_dir="~/tensorflow_datasets")
    records = load_records(num_records=1000, seed=0)   # generated arithmetic word problems

`RagenQA` is a `GeneratorBasedBuilder` with two kinds of config: `file` reads a local file the
user points to (JSON lines or parquet; MetaMathQA's `query`/`response` records, whose answer
is what follows "The answer is:", or plain `question`/`answer` records), and `arithmetic`
generates small word problems from a seed (so tests and the CPU default need no data). The
prepared dataset is written once as `array_record` under `data_dir` and read back with
`as_data_source` — no TensorFlow, no download. Nothing here runs inside jit: the environment
tokenizes the records once on the host (`ragen_jax.envs.qa`).

`tensorflow-datasets` is an optional extra: `pip install 'ragen-jax[datasets]'`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import random
import re
from pathlib import Path

INSTALL_HINT = "pip install 'ragen-jax[datasets]' (or: pip install tensorflow-datasets==4.9.10)"
ANSWER_MARK = "The answer is:"
FORMATS = (".jsonl", ".json", ".parquet")


class DataError(ValueError):
    """A user mistake in a QA data file or setting (one line)."""


def _tfds():
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise DataError(f"the QA environment needs tensorflow-datasets: {INSTALL_HINT}") from None
    return tfds


# ----------------------------------------------------------------------------- generated problems

ITEMS = ["apples", "marbles", "stickers", "books", "pencils", "coins", "cards", "shells"]
NAMES = ["Tom", "Sara", "Ali", "Mia", "Ken", "Lena", "Omar", "Ivy"]


def arithmetic_problem(rng: random.Random) -> tuple[str, str]:
    """One word problem and its answer (an integer, or a decimal with one or two places)."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(2, 60), rng.randint(2, 40)
    kind = rng.randrange(5)
    if kind == 0:
        return f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?", str(a + b)
    if kind == 1:
        a = a + b
        return f"{name} had {a} {item} and gave {b} away. How many {item} are left?", str(a - b)
    if kind == 2:
        a, b = a % 12 + 2, b % 12 + 2
        return f"A box holds {a} rows of {b} {item}. How many {item} are in the box?", str(a * b)
    if kind == 3:
        b = b % 9 + 2
        return f"{name} shares {a * b} {item} equally among {b} friends. How many {item} does each friend get?", str(a)
    cents = rng.choice([25, 50, 75, 125, 150, 250])
    count = rng.randint(2, 9)
    total = cents * count
    price = f"{cents // 100}.{cents % 100:02d}".rstrip("0").rstrip(".")
    answer = f"{total // 100}.{total % 100:02d}".rstrip("0").rstrip(".")
    return f"One pen costs {price} dollars. How many dollars do {count} pens cost?", answer


def arithmetic_records(num_records: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    return [arithmetic_problem(rng) for _ in range(num_records)]


# ----------------------------------------------------------------------------- user files


def _record(obj, where: str) -> tuple[str, str]:
    if not isinstance(obj, dict):
        raise DataError(f"{where}: a record must be an object with question/answer (or MetaMathQA's query/response)")
    if "question" in obj and "answer" in obj:
        question, answer = obj["question"], obj["answer"]
    elif "query" in obj and "response" in obj:
        question, response = obj["query"], str(obj["response"])
        if ANSWER_MARK not in response:
            raise DataError(f"{where}: the response has no {ANSWER_MARK!r} line to take the answer from")
        answer = response.rsplit(ANSWER_MARK, 1)[1]
    else:
        raise DataError(f"{where}: a record needs fields question and answer, or query and response "
                        f"(MetaMathQA); found {', '.join(sorted(map(str, obj))) or 'none'}")
    return str(question).strip(), str(answer).strip()


def file_records(path: str) -> list[tuple[str, str]]:
    """(question, answer) pairs from a JSON lines, JSON (a list) or parquet file."""
    path = os.path.expanduser(path)
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise DataError(f"QA data file {path!r} has extension {suffix or 'none'!r}; allowed: {', '.join(FORMATS)}")
    if not os.path.isfile(path):
        raise DataError(f"QA data file {path!r} does not exist")
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise DataError(f"reading parquet needs pyarrow: {INSTALL_HINT}") from None
        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as err:  # pyarrow raises several types for a broken file
            raise DataError(f"QA data file {path!r} is not a readable parquet file ({type(err).__name__})") from None
        return [_record(row, f"{path} row {i + 1}") for i, row in enumerate(rows)]
    with open(path, encoding="utf-8") as f:
        if suffix == ".json":
            try:
                rows = json.load(f)
            except json.JSONDecodeError as err:
                raise DataError(f"QA data file {path!r} is not valid JSON ({err.msg} at line {err.lineno})") from None
            if not isinstance(rows, list):
                raise DataError(f"QA data file {path!r} must hold a JSON list of records")
            return [_record(row, f"{path} record {i + 1}") for i, row in enumerate(rows)]
        out = []
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as err:
                    raise DataError(f"{path} line {number} is not JSON ({err.msg})") from None
                out.append(_record(obj, f"{path} line {number}"))
        return out


# ----------------------------------------------------------------------------- the builder


@functools.lru_cache(maxsize=None)
def _builder_class():
    """Defined once (tfds registers builder classes by name)."""
    tfds = _tfds()

    @dataclasses.dataclass
    class QAConfig(tfds.core.BuilderConfig):
        source: str = "arithmetic"  # "arithmetic" | "file"
        path: str = ""
        num_records: int = 1000
        seed: int = 0

    class RagenQA(tfds.core.GeneratorBasedBuilder):
        """Question/answer records (see the module docstring); one split, `train`."""

        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self, description="Question/answer records for ragen_jax's QA environment",
                features=tfds.features.FeaturesDict({"question": tfds.features.Text(),
                                                     "answer": tfds.features.Text()}))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            c = self.builder_config
            pairs = file_records(c.path) if c.source == "file" else arithmetic_records(c.num_records, c.seed)
            for i, (question, answer) in enumerate(pairs):
                yield i, {"question": question, "answer": answer}

    return QAConfig, RagenQA


def load_records(path: str = "", num_records: int = 1000, seed: int = 0, data_dir: str = "") -> list[tuple[str, str]]:
    """(question, answer) records in the prepared dataset's order: from `path` when given (its
    contents, size and modification time name the prepared copy), else `num_records`
    generated problems from `seed`. Prepared once under `data_dir` (tfds' default when empty)."""
    if not path and num_records < 1:
        raise DataError(f"num_records={num_records} must be >= 1 (generated problems) or a data file given")
    if path:
        full = os.path.abspath(os.path.expanduser(path))
        if not os.path.isfile(full):
            raise DataError(f"QA data file {path!r} does not exist")
    tfds = _tfds()
    config_cls, builder_cls = _builder_class()
    if path:
        stat = os.stat(full)
        tag = hashlib.sha1(f"{full}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:12]
        config = config_cls(name=f"file_{tag}", source="file", path=full)
    else:
        config = config_cls(name=f"arithmetic_n{num_records}_s{seed}", source="arithmetic", num_records=num_records,
                            seed=seed)
    tfds.disable_progress_bar()
    kwargs = {"data_dir": os.path.expanduser(data_dir)} if data_dir else {}
    builder = builder_cls(config=config, file_format="array_record", **kwargs)
    builder.download_and_prepare()
    source = builder.as_data_source(split="train")
    records = [source[i] for i in range(len(source))]
    return [(_text(r["question"]), _text(r["answer"])) for r in records]


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def normalise(answer: str) -> str:
    """The comparison form of an answer: whitespace removed, ASCII letters lower-cased."""
    return re.sub(r"\s", "", answer).translate(str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz"))
