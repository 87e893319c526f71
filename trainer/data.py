"""Tasks from a spec: a dataset file (through the `datasets` library) or a builtin task, rendered
for the model's tokenizer (system prompt, chat template), overlong prompts dropped at load.

Torch-free: `rlscale validate` reads and checks the rows and the reward with it before
anything starts; the driver builds the same task again (with the tokenizer) at start.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlscale.spec import FieldError, SpecError
from rlscale.trainer.rewards import Reward, RewardError, parse_expression, resolve_reward, score
from rlscale.trainer.tasks import ArithmeticTask, Problem
from rlscale.trainer.tools.prompt import chat_messages, tool_schemas

log = logging.getLogger("rlscale.data")

# File suffix -> the `datasets` builder that reads it.
FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
ROLES = ("system", "user", "assistant", "tool")
CHECK_ROWS = 3  # rows a reward is tried on before the run starts


def load_task(name: str, difficulty: int = 1, seed: int = 0) -> ArithmeticTask:
    """A builtin task by name (spec.task.name, spec.task.difficulty); dataset tasks: rlscale.trainer.data."""
    from rlscale.trainer.tools.task import TASK, ToolArithmeticTask

    if name == TASK:  # products that need the calculator (multi-turn; trainer/tools/task.py)
        return ToolArithmeticTask(seed=seed)
    if name != ArithmeticTask.name:
        raise ValueError(f"spec.task.name: {name!r} is not a builtin task; use 'builtin:arithmetic', "
                         "or set task.dataset to a file of prompts and answers")
    return ArithmeticTask(difficulty=difficulty, seed=seed)


class DatasetError(SpecError):
    """A dataset that cannot be used: one FieldError naming the file, the row and the field."""

    def __init__(self, where: str, value: Any, problem: str, fix: str):
        super().__init__([FieldError(where, value, problem, fix)])


@dataclass
class Row:
    """One dataset row before rendering: a prompt or chat messages, the answer, the fields for the reward."""

    index: int  # 1-based, as a person counts rows (a JSONL file's line without blank lines)
    prompt: str | None
    messages: list[dict] | None
    answer: str
    extra: Mapping = field(default_factory=dict)


@dataclass
class Task:
    """What the driver draws from: rendered train and held-out problems."""

    name: str
    train: list[Problem]
    eval: list[Problem]
    chat: bool
    dropped: dict[str, int] = field(default_factory=dict)


# --------------------------------------------------------------------------- reading


def _load(source: str):
    """A `datasets` Dataset or DatasetDict from a local file, a directory, or a hub id in the cache."""
    if not Path(source).expanduser().exists():
        # A hub id resolves from the HF_HOME cache only (the library reads these at import).
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        import datasets
    except ImportError as exc:
        raise DatasetError("spec.task.dataset", source, f"needs the `datasets` package ({exc})",
                           "pip install 'rlscale[train]' (make venv does)") from None
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    path = Path(source).expanduser()
    try:
        if path.is_file():
            builder = FORMATS.get(path.suffix.lower())
            if builder is None:
                raise DatasetError("spec.task.dataset", source,
                                   f"has the suffix {path.suffix!r}, which rlscale does not read",
                                   f"use one of {', '.join(FORMATS)} or a `datasets` save_to_disk directory")
            return datasets.load_dataset(builder, data_files=str(path))
        if path.is_dir():
            return _load_folder(datasets, path)
        if path.is_absolute() or source.startswith((".", "~")) or "/" not in source:
            raise DatasetError("spec.task.dataset", source, "does not exist",
                               "give a JSONL, Parquet or CSV file, a save_to_disk directory (a relative path is "
                               "read from the spec file's folder), or a hub id in the HF_HOME cache")
        snapshot = _hub_snapshot(source)
        if snapshot is not None:
            return _load_folder(datasets, snapshot)
        if source.count("/") > 1:
            raise DatasetError("spec.task.dataset", source, "is not in the Hugging Face cache (HF_HOME)",
                               "download it there first: HF_HOME=<cache> hf download ORG/NAME --repo-type dataset")
        return datasets.load_dataset(source)  # a dataset `datasets` itself cached under HF_HOME
    except DatasetError:
        raise
    except Exception as exc:  # the library's message can quote the file's lines: only its kind goes to status
        raise DatasetError("spec.task.dataset", source, f"cannot be read ({exc.__class__.__name__})",
                           "fix the file (one JSON object per line for .jsonl; `datasets.load_dataset` on it shows "
                           "where), or for a hub id put the dataset in the HF_HOME cache first") from None


def _load_folder(datasets, path: Path):
    """A save_to_disk directory, or a folder of data files whose names give the splits."""
    if (path / "dataset_dict.json").is_file() or (path / "dataset_info.json").is_file():
        return datasets.load_from_disk(str(path))
    return datasets.load_dataset(str(path))


def _hub_snapshot(source: str) -> Path | None:
    """ORG/NAME[/FOLDER...] from the hub cache under HF_HOME, as `hf download --repo-type dataset`
    leaves it (never downloaded here); None when the cache does not have it."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    org, name, *folder = source.split("/")
    try:
        root = Path(snapshot_download(f"{org}/{name}", repo_type="dataset", local_files_only=True))
    except LocalEntryNotFoundError:
        return None
    path = root.joinpath(*folder)
    if not path.is_dir():
        have = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        raise DatasetError("spec.task.dataset", source, f"names a folder the cached dataset {org}/{name} lacks",
                           f"use one of its folders: {', '.join(have) or '(none: name the dataset alone)'}")
    return path


def _split(loaded, task, source: str) -> tuple[Any, Any | None]:
    """(train rows, eval rows or None) from what _load returned, per task.trainSplit / evalSplit."""
    splits = dict(loaded) if hasattr(loaded, "keys") else {"train": loaded}
    names = ", ".join(splits)
    if task.train_split not in splits:
        raise DatasetError("spec.task.trainSplit", task.train_split, f"is not a split of {source} (it has: {names})",
                           f"use one of: {names}")
    if task.eval_split is not None and task.eval_split not in splits:
        raise DatasetError("spec.task.evalSplit", task.eval_split, f"is not a split of {source} (it has: {names})",
                           f"use one of: {names}, or leave it unset to hold out task.evalFraction of the train split")
    return splits[task.train_split], splits[task.eval_split] if task.eval_split else None


def _text(value: Any) -> str | None:
    """A reference answer as text: strings as they are, numbers written plainly; None if neither."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _rows(data, task, source: str, split: str, needs_answer: bool) -> list[Row]:
    """Check every row (fields present, of the right type) and turn it into a Row."""
    columns = list(data.column_names)
    where = "spec.task.dataset"

    def need_column(name: str, field_name: str) -> None:
        if name not in columns:
            raise DatasetError(f"spec.task.{field_name}", name, f"is not a column of {source} ({split} split; "
                               f"columns: {', '.join(columns)})", f"set task.{field_name} to the column that holds it")

    prompt_field = task.messages_field or task.prompt_field or "prompt"
    need_column(prompt_field, "messagesField" if task.messages_field else "promptField")
    if needs_answer:
        need_column(task.answer_field, "answerField")
    # A plug-in reward may do without answers; a dataset that has the column has it in every row.
    needs_answer = needs_answer or task.answer_field in columns
    for name in task.extra_fields or []:
        need_column(name, "extraFields")
    out = []
    for i, rec in enumerate(data, start=1):
        def bad(name: str, problem: str, fix: str, _i: int = i) -> DatasetError:
            return DatasetError(where, source, f"{split} row {_i}: field {name!r} {problem}", fix)

        value = rec.get(prompt_field)
        prompt = messages = None
        if task.messages_field:
            if not isinstance(value, list) or not value:
                raise bad(prompt_field, f"is {_brief(value)}, not a list of chat messages",
                          "write [{role: user, content: ...}, ...] in every row")
            for k, m in enumerate(value):
                if not isinstance(m, Mapping) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                    raise bad(f"{prompt_field}[{k}]", f"is {_brief(m)}",
                              f"each message needs a role ({', '.join(ROLES)}) and a string content")
            messages = [{"role": m["role"], "content": m["content"]} for m in value]
        else:
            if not isinstance(value, str) or not value.strip():
                raise bad(prompt_field, f"is {_brief(value)}, not a non-empty string",
                          "give every row a prompt (or set task.messagesField for chat messages)")
            prompt = value
        answer = _text(rec.get(task.answer_field)) if task.answer_field in rec else None
        if answer is None:
            if needs_answer:
                value = rec.get(task.answer_field)
                raise bad(task.answer_field,
                          "is missing" if value is None else f"is {_brief(value)}, not a string or a number",
                          "give every row an answer (a plug-in reward without answers: drop the column)")
            answer = ""
        if task.extra_fields is None:
            extra = dict(rec)
        else:
            extra = {}
            for name in task.extra_fields:
                if rec.get(name) is None:
                    raise bad(name, "is missing",
                              "give every row the fields task.extraFields names, or drop it from the list")
                extra[name] = rec[name]
        out.append(Row(i, prompt, messages, answer, extra))
    if not out:
        raise DatasetError(where, source, f"has no rows in its {split} split", "give it prompts")
    return out


def _brief(value: Any) -> str:
    """A row's value as its type and size, never its text: the dataset may be a file the run author cannot
    read (a mounted Secret, say), and the error goes into the RLRun's status."""
    if value is None:
        return "missing"
    if isinstance(value, str):
        return f"str ({len(value)} characters)"
    if isinstance(value, (list, tuple, dict)):
        return f"{type(value).__name__} ({len(value)} items)"
    return type(value).__name__


def read_rows(task, needs_answer: bool = True) -> tuple[list[Row], list[Row]]:
    """(train rows, held-out rows) of task.dataset; every problem is a DatasetError naming file, row and field."""
    source = task.dataset
    train_data, eval_data = _split(_load(source), task, source)
    train = _rows(train_data, task, source, task.train_split, needs_answer)
    if eval_data is not None:
        held = _rows(eval_data, task, source, task.eval_split, needs_answer)
    else:
        # The split depends on (rows, seed) alone, so every process and every resumed run agrees.
        order = np.random.default_rng(task.seed).permutation(len(train))
        n_eval = max(1, round(task.eval_fraction * len(train)))
        if n_eval >= len(train):
            raise DatasetError("spec.task.evalFraction", task.eval_fraction, f"leaves no training rows of {len(train)}",
                               "lower it, or give an evalSplit")
        held = [train[i] for i in order[:n_eval]]
        train = [train[i] for i in sorted(order[n_eval:])]
    if task.eval_size is not None:
        held = held[: task.eval_size]
    return train, held


def builtin_rows(task) -> tuple[list[Row], list[Row]]:
    """A builtin task as rows (its own fixed split)."""
    t = load_task(task.name or ArithmeticTask.name, difficulty=task.difficulty, seed=0)
    to_rows = lambda ps: [Row(i, p.prompt, None, p.answer, {}) for i, p in enumerate(ps, start=1)]  # noqa: E731
    held = t.eval[: task.eval_size] if task.eval_size is not None else t.eval
    return to_rows(t.train), to_rows(held)


# --------------------------------------------------------------------------- rendering


def use_chat(task, tokenizer, model: str = "the model") -> bool:
    """Whether prompts go through the model's chat template (task.chat: true, false, or unset = if it has one)."""
    has = bool(getattr(tokenizer, "chat_template", None))
    if task.chat is True and not has:
        raise DatasetError("spec.task.chat", True, f"asks for a chat template, but {model} has none",
                           "set task.chat: false (prompts are then given as plain text), or use an instruct model")
    if task.messages_field and not (has and task.chat is not False):
        raise DatasetError("spec.task.messagesField", task.messages_field,
                           f"holds chat messages, but {model} has no chat template to render them" if not has
                           else "holds chat messages, but task.chat is false",
                           "use an instruct model with a chat template, or a promptField of plain text")
    return has if task.chat is None else bool(task.chat)


def render(rows: Sequence[Row], tokenizer, task, chat: bool, max_prompt_tokens: int) -> tuple[list[Problem], int]:
    """Problems with the text and tokens the model is given; prompts over max_prompt_tokens are dropped (counted)."""
    out, dropped = [], 0
    system = task.system_prompt
    schemas = []
    if chat and getattr(task, "tools", None):  # the tools go into the prompt: the template's way, else Hermes'
        schemas = tool_schemas(task.tools)
    for r in rows:
        if chat:
            msgs, extra = chat_messages(list(r.messages) if r.messages else [{"role": "user", "content": r.prompt}],
                                        system, tokenizer, schemas)
            text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **extra)
            ids = tokenizer(text, add_special_tokens=False).input_ids  # the template wrote the special tokens
        else:
            text = f"{system}\n\n{r.prompt}" if system else r.prompt
            ids = tokenizer(text).input_ids
        if len(ids) > max_prompt_tokens:
            dropped += 1
            continue
        out.append(Problem(text, r.answer, r.extra, tuple(ids)))
    return out, dropped


def build_task(spec, tokenizer, model: str = "the model") -> Task:
    """The task a spec names, rendered for the tokenizer; errors name the field, value and fix."""
    t = spec.task
    reward_needs_answer = resolve_reward(t.reward, format_pattern=t.format_pattern).needs_answer
    train_rows, eval_rows = read_rows(t, reward_needs_answer) if t.dataset else builtin_rows(t)
    chat = use_chat(t, tokenizer, model)
    room = spec.model.max_length - t.max_new_tokens
    train, dropped_train = render(train_rows, tokenizer, t, chat, room)
    held, dropped_eval = render(eval_rows, tokenizer, t, chat, room)
    where = t.dataset or t.name
    if dropped_train or dropped_eval:
        log.warning("%s: dropped %d of %d train and %d of %d held-out prompts longer than model.maxLength - "
                    "task.maxNewTokens = %d tokens", where, dropped_train, len(train_rows), dropped_eval,
                    len(eval_rows), room)
    for name, kept, rows in (("train", train, train_rows), ("held-out", held, eval_rows)):
        if not kept:
            longest = max(len(render([r], tokenizer, t, chat, 10**9)[0][0].prompt_ids) for r in rows[:200])
            raise SpecError([FieldError("spec.model.maxLength", spec.model.max_length,
                                        f"leaves no room for any {name} prompt of {where} ({len(rows)} rows; "
                                        f"prompts reach {longest} tokens, task.maxNewTokens is {t.max_new_tokens})",
                                        f"raise maxLength to at least {longest + t.max_new_tokens}")])
    log.info("%s: %d train and %d held-out prompts (chat template: %s)", where, len(train), len(held),
             "yes" if chat else "no")
    return Task(t.name, train, held, chat, {"train": dropped_train, "eval": dropped_eval})


# --------------------------------------------------------------------------- checks before a run


def try_reward(reward: Reward, problems: Sequence[Problem | Row]) -> None:
    """Call the reward on a few rows (the reference answer as the completion): it must give finite
    floats in time; else a SpecError naming task.reward, the prompt and the completion."""
    rows = list(problems)[:CHECK_ROWS]
    prompts = [r.prompt if r.prompt is not None else str(r.messages) for r in rows]
    try:
        score(reward, prompts, [r.answer for r in rows], [r.answer for r in rows], [True] * len(rows),
              [r.extra for r in rows])
    except RewardError as exc:
        raise SpecError([FieldError("spec.task.reward", reward.expression,
                                    f"fails on the first rows of the task: {exc}",
                                    "fix the reward")]) from None


MODEL_MOUNT = "/models"  # where pods mount model.volume


def dataset_on_cluster(spec) -> bool:
    """True when task.dataset is not on this machine but the pods will find it: an absolute path
    under a folder they mount (/models, where model.volume goes, or a learner pod.volumeMounts
    path), or a hub id (with model.volume, whose Hugging Face cache the pods use). The learner
    reads and checks it when the run starts."""
    path = spec.task.dataset
    if not path or Path(path).expanduser().exists():
        return False
    if not path.startswith(("/", ".", "~")) and "/" in path:
        # A hub id: on a cluster it resolves from the model volume's Hugging Face cache.
        if spec.model.volume is None:
            return False
        try:
            return _hub_snapshot(path) is None
        except DatasetError:
            return False
    if not path.startswith("/"):
        return False
    mounts = [MODEL_MOUNT]
    pod = getattr(spec.learner, "pod", None)
    mounts += [m.mount_path for m in getattr(pod, "volume_mounts", None) or []]
    return any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounts)


def plugins_on_cluster(spec) -> bool:
    """True when task.pluginVolume ships the reward's plug-ins and one of them cannot be found
    on this machine: rank 0 imports and tries it when the run starts (the same checks, then)."""
    import importlib.util

    t = spec.task
    if t.plugin_volume is None:
        return False
    try:
        modules = [name.partition(":")[0] for _, name in parse_expression(t.reward) if ":" in name]
    except ValueError:
        return False  # not an expression: the reward check names that
    for name in modules:
        try:
            if importlib.util.find_spec(name) is None:
                return True
        except (ImportError, ValueError):  # a dotted name whose parent package is not here
            return True
    return False


def check_workload(spec) -> list[FieldError]:
    """What `rlscale validate` checks beyond the spec: the reward imports, the dataset's rows are
    usable, and the reward gives a finite float on a few of them. No model or tokenizer needed.
    A dataset on a cluster's volume, and plug-ins shipped in task.pluginVolume, are checked by
    the learner at start (the same checks, then); a tracker spec.logging asks for is installed."""
    from rlscale.trainer.reward_model import check_reward_model
    from rlscale.trainer.trackers import check_trackers

    if early := check_trackers(spec.logging) or check_reward_model(spec):
        return early
    t = spec.task
    reward = None
    if not plugins_on_cluster(spec):
        try:
            reward = resolve_reward(t.reward, format_pattern=t.format_pattern, timeout_s=t.reward_timeout)
        except ValueError as exc:
            return [_as_field_error(exc, "spec.task.reward", t.reward)]
        if bad := check_plugins(t):  # the tools' and the environment's module:names import
            return bad
    if dataset_on_cluster(spec):
        return []
    try:
        needs_answer = reward.needs_answer if reward else True
        rows = read_rows(t, needs_answer)[0] if t.dataset else builtin_rows(t)[0]
    except SpecError as exc:
        return list(exc.errors)
    try:
        if reward and (local := reward.without_batched()):  # the reward model is tried by the driver, at start
            try_reward(local, rows)
    except SpecError as exc:
        return list(exc.errors)
    return []


def check_plugins(task) -> list[FieldError]:
    """task.tools' plug-in functions and task.environment's class, imported as the tool workers and the driver
    will (rlscale.trainer.tools.plugins.import_object)."""
    from rlscale.trainer.tools.plugins import import_object

    named = [(f"spec.task.tools[{i}].function", x.function) for i, x in enumerate(task.tools or []) if x.function]
    named += [("spec.task.environment", task.environment)] if task.environment else []
    for path, value in named:
        try:
            import_object(value, path)
        except ValueError as exc:
            return [_as_field_error(exc, path, value)]
    return []


def _as_field_error(exc: Exception, path: str, value: Any) -> FieldError:
    """A 'spec.task.reward: 'x': problem; fix' message as a FieldError."""
    text = str(exc)
    prefix = f"{path}: {value!r}: "
    text = text[len(prefix):] if text.startswith(prefix) else text.removeprefix(f"{path}: ")
    problem, _, fix = text.rpartition("; ")
    return FieldError(path, value, problem or text, fix if problem else "")


def check_before_start(spec, model_dir: str | Path) -> Task:
    """Everything about the workload that can fail, checked before any process starts: the
    reward, every dataset row, the chat template and the prompts' lengths for this model."""
    errors = check_workload(spec)
    if errors:
        raise SpecError(errors)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    return build_task(spec, tok, model=spec.model.path)


def resolve_dataset_path(spec, spec_file: str | Path) -> None:
    """A relative task.dataset is read from the spec file's folder (as compose files do), else
    from the working directory; the spec then carries the absolute path to every process."""
    t = spec.task
    if not t.dataset or Path(t.dataset).expanduser().is_absolute():
        return
    for base in (Path(spec_file).resolve().parent, Path.cwd()):
        if (base / t.dataset).exists():
            t.dataset = str((base / t.dataset).resolve())
            return
