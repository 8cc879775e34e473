"""Agent definitions: one YAML or TOML file per agent version, or agents defined in code, loaded and validated at start.

A definition names its decider, its tools (kind, contract flags, JSON Schema),
its budgets and its model / prompt / policy versions. Anything invalid stops
the executor with one line naming the file and the field (`DefinitionError`).
"""

from __future__ import annotations

import importlib
import re
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

import jsonschema
import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from shared.canonical import sha256_of

_NAME = r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$"
_NODE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
SUFFIXES = (".yaml", ".yml", ".toml")


class DefinitionError(Exception):
    """An agent definition that cannot be served. str() is one line: file, field, problem."""

    def __init__(self, path: Path | str, field: str, problem: str) -> None:
        super().__init__(f"{path}: {field}: {problem}")
        self.path, self.field, self.problem = str(path), field, problem


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ToolContract(_Strict):
    idempotent: bool = False  # the downstream dedupes by Idempotency-Key
    lookup: bool = False  # the downstream answers a query by idempotency key
    fenced: bool = False  # the downstream refuses a stale X-Fencing-Token
    requires_approval: bool = False  # PAUSED_HUMAN before Tx1 until approved

    @property
    def retry_after_not_found(self) -> bool:
        # A lookup's "not found" only proves the request can never take effect
        # when the lookup also raised the fence, so a late stale send is refused.
        return self.lookup and self.fenced


class _ToolBase(_Strict):
    name: str = Field(pattern=_NAME)
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    # Only read for its sensitive marks ("x-agentrt-sensitive": true on a property): the answer's
    # marked fields are stored sealed (docs/encryption.md).
    output_schema: dict[str, Any] | None = None
    contract: ToolContract = Field(default_factory=ToolContract)
    timeout_s: float = Field(default=30.0, gt=0, le=3600)

    @model_validator(mode="after")
    def _schema(self) -> _ToolBase:
        try:
            jsonschema.Draft202012Validator.check_schema(self.input_schema)
        except jsonschema.SchemaError as exc:
            raise ValueError(f"input_schema is not a valid JSON Schema: {exc.message}") from None
        if self.input_schema.get("type", "object") != "object":
            raise ValueError("input_schema must describe a JSON object")
        return self


class HttpTool(_ToolBase):
    kind: Literal["http"]
    url: str = Field(pattern=r"^https?://")
    # GET {lookup_url}?key=<idempotency key>; required with contract.lookup.
    lookup_url: str | None = Field(default=None, pattern=r"^https?://")
    remote_id_field: str = "id"
    headers: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _lookup(self) -> HttpTool:
        if self.contract.lookup != (self.lookup_url is not None):
            raise ValueError("contract.lookup and lookup_url go together")
        return self


class PythonTool(_ToolBase):
    kind: Literal["python"]
    # "package.module:function"; called with (arguments, ToolCallContext).
    callable: str = Field(pattern=r"^[\w.]+:[\w.]+$")
    # "package.module:function"; called with (idempotency_key, ToolCallContext).
    lookup_callable: str | None = Field(default=None, pattern=r"^[\w.]+:[\w.]+$")

    @model_validator(mode="after")
    def _lookup(self) -> PythonTool:
        if self.contract.lookup != (self.lookup_callable is not None):
            raise ValueError("contract.lookup and lookup_callable go together")
        return self


class McpServerAddress(_Strict):
    """Where an MCP server is: a streamable-HTTP `url`, or a `command` the executor starts and talks to over stdio."""

    url: str | None = Field(default=None, pattern=r"^https?://")
    command: list[str] | None = Field(default=None, min_length=1)
    env: dict[str, str] = Field(default_factory=dict)  # stdio only: over the SDK's default environment
    cwd: str | None = None  # stdio only
    headers: dict[str, str] = Field(default_factory=dict)  # streamable HTTP only

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerAddress:
        if (self.url is None) == (self.command is None):
            raise ValueError("an MCP server needs exactly one of url, command")
        return self

    def describe(self) -> str:
        return self.url or " ".join(self.command or ())


class McpToolOverride(_Strict):
    """An agent's word on one tool of an MCP server, over what the server's annotations say."""

    idempotent: bool | None = None  # default: readOnlyHint or idempotentHint
    fenced: bool | None = None  # the server refuses a stale agentrt/fencing-token
    requires_approval: bool | None = None
    # A tool of the same server that answers {"idempotency_key": ...} with {"found": true, "response": ...}
    # or {"found": false}: the in-doubt lookup.
    lookup_tool: str | None = Field(default=None, pattern=_NAME)
    timeout_s: float | None = Field(default=None, gt=0, le=3600)


class McpServerTools(_Strict):
    """`tools: [{kind: mcp, server: {...}}]`: every tool the server lists when the executor starts."""

    kind: Literal["mcp"]
    server: McpServerAddress
    prefix: str = Field(default="", pattern=r"^[A-Za-z0-9._/-]{0,100}$")  # served as prefix + the server's name
    include: list[str] | None = None  # only these of the server's tools (default: all)
    tools: dict[str, McpToolOverride] = Field(default_factory=dict)
    timeout_s: float = Field(default=30.0, gt=0, le=3600)
    connect_timeout_s: float = Field(default=10.0, gt=0, le=600)


class McpTool(_ToolBase):
    """One tool of an MCP server, as listed at start (executor.tools.mcp); never written by hand."""

    kind: Literal["mcp"]
    server: McpServerAddress
    remote_name: str
    lookup_tool: str | None = None
    annotations: dict[str, Any] = Field(default_factory=dict)
    connect_timeout_s: float = 10.0


ToolDefinition = Annotated[HttpTool | PythonTool, Field(discriminator="kind")]


class Condition(_Strict):
    """`when:` of a plan node: `value` (usually a template such as "${input.amount}") compared by one operator."""

    value: Any
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    eq: Any = None
    ne: Any = None

    @model_validator(mode="after")
    def _one_operator(self) -> Condition:
        if len(self.operators()) != 1:
            raise ValueError("a condition needs exactly one of gt, ge, lt, le, eq, ne")
        return self

    def operators(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("gt", "ge", "lt", "le", "eq", "ne") if k in self.model_fields_set}


class SpawnChild(_Strict):
    """One child of a plan node's spawn: an agent, its input (templates rendered), labels and budget."""

    agent: str
    version: str = ""
    input: dict[str, Any] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    budget: dict[str, Any] = Field(default_factory=dict)


class SpawnNode(_Strict):
    """Spawn child runs and wait for all or any of them (at most the node's timeout_ms). The answer is
    ${inputs.<node>}: {"join", "timed_out", "children": [{"index", "run_id", "agent", "status", "result",
    "error"}]}. `for_each`: one child per item of the list it renders to (${item} in the template child)."""

    children: list[SpawnChild] = Field(default_factory=list)
    for_each: Any = None
    child: SpawnChild | None = None
    join: str = "all"
    detach: bool = False
    share_budget: bool = False


class PlanNode(_Strict):
    """One node of a scripted plan: exactly one of tool / sleep_ms / wait_for_input / wait_for_signal /
    finish / fail."""

    id: str = Field(pattern=_NODE)
    # Entered only when this holds; otherwise the plan moves on to the node that would follow it.
    when: Condition | None = None
    tool: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    sleep_ms: int | None = Field(default=None, gt=0)
    wait_for_input: str | None = None
    # Wait for a signal of this name (RunService.SignalRun), at most timeout_ms; the answer is
    # ${inputs.<node>}: {"name", "payload", "seq", "timed_out"}.
    wait_for_signal: str | None = None
    spawn: SpawnNode | None = None
    timeout_ms: int = Field(default=86_400_000, gt=0, le=366 * 24 * 3600 * 1000)
    finish: Any = None
    fail: str | None = None
    # Where to go next (default: the following node); a node may be revisited.
    next: str | None = None
    # After a definite tool failure: "fail" (end the run), "continue", or a node id.
    on_failure: str = "fail"
    # Visit the node this many times in a row before moving on.
    repeat: int = Field(default=1, ge=1, le=100_000)

    @model_validator(mode="after")
    def _one_action(self) -> PlanNode:
        chosen = [k for k in ("tool", "sleep_ms", "wait_for_input", "wait_for_signal", "spawn", "fail")
                  if getattr(self, k) is not None]
        if "finish" in self.model_fields_set:  # `finish: null` ends the run with no result
            chosen.append("finish")
        if len(chosen) != 1:
            raise ValueError("a plan node needs exactly one of tool, sleep_ms, wait_for_input, wait_for_signal, "
                             "spawn, finish, fail")
        return self


class ScriptedDecider(_Strict):
    kind: Literal["scripted"]
    plan: list[PlanNode] = Field(min_length=1)


class ContextPolicy(_Strict):
    """What of a long run's history goes to the model (docs/models.md, Bounded context): the last
    `last_turns` steps verbatim, each tool answer capped at `max_tool_answer_chars` with a pointer to the
    full answer; with `summarise`, the steps before the window are folded into a running summary by a
    model call of their own, `summarise_every` steps at a time, kept in the run's checkpoint."""

    last_turns: int = Field(default=40, ge=1, le=64)  # tool/sleep/input turns (64 answers stay loaded)
    max_tool_answer_chars: int = Field(default=4000, ge=100)
    summarise: bool = False
    # Steps past the window summarised together; last_turns + summarise_every <= 64 (the answers in memory).
    summarise_every: int = Field(default=16, ge=1, le=63)
    summary_max_chars: int = Field(default=4000, ge=200, le=12_000)  # the summary lives in the checkpoint
    summary_prompt: str = ""  # instructions for the summarisation call (empty: the built-in ones)
    # The prompt's budget in tokens, estimated at 4 characters a token: over it, the window shrinks (to a
    # quarter, then a sixteenth) before the call, as on a context-too-long answer. None: no estimate.
    max_prompt_tokens: int | None = Field(default=None, ge=100)

    @model_validator(mode="after")
    def _window(self) -> ContextPolicy:
        if self.summarise and self.last_turns + self.summarise_every > 64:
            raise _FieldProblem("summarise_every", "last_turns + summarise_every must be at most 64")
        return self


class ModelDeciderBase(_Strict):
    """What the `openai` and `anthropic` deciders share (docs/models.md)."""

    model: str = Field(min_length=1)
    # Where the key comes from: a file (its first line; e.g. a mounted secret), else this environment
    # variable, else the executor's setting for the provider. Keys never enter checkpoints, logs or spans.
    api_key_file: str | None = None
    api_key_env: str | None = None
    temperature: float | None = Field(default=0.0, ge=0, le=2)
    max_output_tokens: int | None = Field(default=None, gt=0)
    timeout_s: float = Field(default=60.0, gt=0)
    # Per-definition prices (USD per 1,000 tokens); 0 = the executor's model_prices table.
    usd_per_1k_input_tokens: float = Field(default=0.0, ge=0)
    usd_per_1k_output_tokens: float = Field(default=0.0, ge=0)
    allow_sleep: bool = True
    allow_wait_for_input: bool = True
    # Several tool calls in one reply: each becomes its own ledgered step, in the reply's order.
    parallel_tool_calls: bool = True
    # JSON Schema of the final answer (agentrt_finish's `result`): a result that does not fit is an
    # invalid decision, recorded and retried.
    result_schema: dict[str, Any] | None = None
    context: ContextPolicy = Field(default_factory=ContextPolicy)

    @model_validator(mode="after")
    def _result_schema(self) -> ModelDeciderBase:
        if self.result_schema is not None:
            try:
                jsonschema.Draft202012Validator.check_schema(self.result_schema)
            except jsonschema.SchemaError as exc:
                raise _FieldProblem("result_schema", f"not a valid JSON Schema: {exc.message}") from None
        return self


class OpenAIDecider(ModelDeciderBase):
    """OpenAI's Chat Completions (`api: chat`, also any OpenAI-compatible endpoint: vLLM, Ollama...) or
    Responses API (`api: responses`), through the official `openai` SDK."""

    kind: Literal["openai"]
    base_url: str = Field(pattern=r"^https?://")
    api: Literal["chat", "responses"] = "chat"


class AnthropicDecider(ModelDeciderBase):
    """Anthropic's Messages API through the official `anthropic` SDK."""

    kind: Literal["anthropic"]
    base_url: str = Field(default="https://api.anthropic.com", pattern=r"^https?://")
    max_output_tokens: int | None = Field(default=4096, gt=0)  # the Messages API requires max_tokens
    temperature: float | None = Field(default=None, ge=0, le=1)  # None: the model's default
    # cache_control breakpoints on the stable prefix (tools + system, the input and summary) and on the
    # conversation's end, so each call reads what the previous one wrote.
    prompt_caching: bool = True


class PythonDecider(_Strict):
    """Decisions from your own code: `callable` is "package.module:function", given an executor.sdk.Context."""

    kind: Literal["python"]
    callable: str = Field(pattern=r"^[\w.]+:[\w.]+$")
    # Deterministic and without I/O: the next decision may be made before Tx2 and saved with it.
    pure: bool = False


DeciderDefinition = Annotated[ScriptedDecider | OpenAIDecider | AnthropicDecider | PythonDecider,
                              Field(discriminator="kind")]


class Budgets(_Strict):
    max_steps: int = Field(default=0, ge=0)  # 0 = unlimited
    max_tokens: int = Field(default=0, ge=0)
    max_cost_usd: float = Field(default=0.0, ge=0)
    deadline_s: float = Field(default=0.0, ge=0)  # wall clock from the run's creation (database time)


class Policy(_Strict):
    version: str = "1"
    on_budget_exhausted: Literal["fail", "pause"] = "fail"
    on_approval_rejected: Literal["fail", "continue"] = "fail"
    # Consecutive invalid decisions (parse failure, refusal, filter, bad arguments) before giving up.
    max_decision_retries: int = Field(default=3, ge=0, le=100)
    on_decision_retries_exhausted: Literal["fail", "pause"] = "fail"
    # When the downstream stays transiently unavailable past the run's max_attempts.
    pause_when_attempts_exhausted: bool = False


class ModelInfo(_Strict):
    provider: str = ""
    name: str = ""
    version: str = ""


class PromptInfo(_Strict):
    version: str = ""
    system: str = ""


class Concurrency(_Strict):
    # At most `max` runs of one key (per tenant) hold a lease at once; the key is rendered from the
    # run's input at submit, e.g. "${input.customer_id}".
    key: str = Field(min_length=1, max_length=500, pattern=r"^([^$]|\$\{input(\.[A-Za-z0-9_-]+)+\})*$")
    max: int = Field(ge=1, le=1_000_000)


class AgentDefinition(_Strict):
    format: Literal[1] = 1
    name: str = Field(pattern=_NAME)
    version: str = Field(min_length=1, max_length=100)
    description: str = ""
    # JSON Schema of the run's input: the scheduler checks every submit against it (the agent registry).
    input_schema: dict[str, Any] | None = None
    # Priority of runs submitted without one: 1 (lowest) .. 9 (highest); unset = the scheduler's default.
    priority: int | None = Field(default=None, ge=1, le=9)
    concurrency: Concurrency | None = None
    # The signals the agent declares: name -> JSON Schema of the payload. The scheduler refuses a signal of
    # a declared name that does not fit (INVALID_ARGUMENT) and seals its "x-agentrt-sensitive" properties;
    # undeclared names are taken as they are.
    signals: dict[str, dict[str, Any]] = Field(default_factory=dict)
    # JSON Schema of the input a human gives ResumeRun: its marked properties are sealed.
    resume_input_schema: dict[str, Any] | None = None
    decider: DeciderDefinition
    tools: list[ToolDefinition] = Field(default_factory=list)
    # The `kind: mcp` entries of `tools`, moved here when parsed; their tools join `tools` when the
    # executor has listed them (executor.tools.mcp.list_mcp_tools).
    mcp_servers: list[McpServerTools] = Field(default_factory=list)
    budgets: Budgets = Field(default_factory=Budgets)
    policy: Policy = Field(default_factory=Policy)
    model: ModelInfo = Field(default_factory=ModelInfo)
    prompt: PromptInfo = Field(default_factory=PromptInfo)
    _source: str = PrivateAttr(default="<memory>")  # the file it came from, for error messages

    @property
    def source(self) -> str:
        return self._source

    @model_validator(mode="before")
    @classmethod
    def _mcp_entries(cls, data: Any) -> Any:
        tools = data.get("tools") if isinstance(data, dict) else None
        if not isinstance(tools, list) or not any(isinstance(t, dict) and t.get("kind") == "mcp" for t in tools):
            return data
        servers = [t for t in tools if isinstance(t, dict) and t.get("kind") == "mcp"]
        return {**data, "tools": [t for t in tools if not (isinstance(t, dict) and t.get("kind") == "mcp")],
                "mcp_servers": [*data.get("mcp_servers", ()), *servers]}

    @model_validator(mode="after")
    def _references(self) -> AgentDefinition:
        if self.input_schema is not None:
            try:
                jsonschema.Draft202012Validator.check_schema(self.input_schema)
            except jsonschema.SchemaError as exc:
                raise _FieldProblem("input_schema", f"not a valid JSON Schema: {exc.message}") from None
        for where, schema in (*((f"signals.{n}", v) for n, v in self.signals.items()),
                              ("resume_input_schema", self.resume_input_schema)):
            if schema is not None:
                try:
                    jsonschema.Draft202012Validator.check_schema(schema)
                except jsonschema.SchemaError as exc:
                    raise _FieldProblem(where, f"not a valid JSON Schema: {exc.message}") from None
        if any(not re.fullmatch(_NAME, n) for n in self.signals):
            raise _FieldProblem("signals", f"signal names must match {_NAME}")
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ValueError("tool names must be unique")
        if isinstance(self.decider, ScriptedDecider):
            ids = [n.id for n in self.decider.plan]
            if len(set(ids)) != len(ids):
                raise ValueError("decider.plan: node ids must be unique")
            for index, node in enumerate(self.decider.plan):
                where = f"decider.plan.{index}"
                # An MCP server's tools are known once listed: checked again then (check_plan_tools).
                if node.tool is not None and node.tool not in names and not self.mcp_servers:
                    raise _FieldProblem(f"{where}.tool", f"unknown tool {node.tool!r}")
                if node.next is not None and node.next not in ids:
                    raise _FieldProblem(f"{where}.next", f"unknown node {node.next!r}")
                if node.on_failure not in ("fail", "continue", *ids):
                    raise _FieldProblem(f"{where}.on_failure", "must be fail, continue or a node id")
        return self

    def check_plan_tools(self) -> None:
        """Every tool a scripted plan names is served (after the MCP servers' tools were listed)."""
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise DefinitionError(self.source, "tools", "tool names must be unique (an MCP server's tools included)")
        if isinstance(self.decider, ScriptedDecider):
            for index, node in enumerate(self.decider.plan):
                if node.tool is not None and node.tool not in names:
                    raise DefinitionError(self.source, f"decider.plan.{index}.tool", f"unknown tool {node.tool!r}")

    def tool(self, name: str) -> HttpTool | PythonTool | McpTool | None:
        for tool in self.tools:
            if tool.name == name:
                return tool
        return None

    def tool_schemas_hash(self) -> str:
        return sha256_of([[t.name, t.input_schema] for t in self.tools]).hex()[:16]


class _FieldProblem(ValueError):
    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}|{problem}")


def _field_and_problem(exc: ValidationError) -> tuple[str, str]:
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first["loc"] if p not in ("http", "python", "scripted", "openai", "anthropic"))
    field = field.replace("mcp_servers.", "tools.mcp.", 1)
    message = str(first.get("msg", "invalid"))
    message = re.sub(r"^(Value error|Assertion failed), ", "", message)
    if "|" in message and not field:
        field, _, message = message.partition("|")
    elif "|" in message:
        sub, _, message = message.partition("|")
        field = f"{field}.{sub}" if field else sub
    return field or "(file)", message


def parse_definition(data: Any, path: Path | str = "<memory>") -> AgentDefinition:
    if not isinstance(data, dict):
        raise DefinitionError(path, "(file)", "must be a mapping")
    try:
        definition = AgentDefinition.model_validate(data)
    except ValidationError as exc:
        field, problem = _field_and_problem(exc)
        raise DefinitionError(path, field, problem) from None
    definition._source = str(path)
    return definition


def load_file(path: Path) -> AgentDefinition:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DefinitionError(path, "(file)", f"cannot read: {exc.strerror}") from None
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise DefinitionError(path, "(file)", f"not valid {path.suffix[1:].upper()}: "
                                              f"{str(exc).splitlines()[0]}") from None
    return parse_definition(data, path)


_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def definition_files(spec: str) -> list[Path]:
    """The files `agents_path` names: a directory (its *.yaml/*.yml/*.toml) or comma-separated files.

    A part that is no file or directory but a dotted module name is left to `definition_modules`.
    """
    files: list[Path] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        path = Path(part)
        if path.is_dir():
            files.extend(sorted(p for p in path.iterdir() if p.suffix in SUFFIXES and p.is_file()))
        elif path.is_file():
            if path.suffix not in SUFFIXES:
                hint = (f"; a Python module is named by its dotted name ({'.'.join(path.with_suffix('').parts)})"
                        if path.suffix == ".py" else "")
                raise DefinitionError(path, "(file)", f"not an agent definition file (*.yaml, *.yml, *.toml){hint}")
            files.append(path)
        elif not (_MODULE.match(part) and path.suffix not in SUFFIXES):
            raise DefinitionError(path, "(file)", "no such file or directory")
    return files


def definition_modules(spec: str) -> list[AgentDefinition]:
    """The agents defined in code in the modules `agents_path` names (executor.sdk's @agent, or
    AgentDefinition objects at module level), in the order the modules define them."""
    found: list[AgentDefinition] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        if Path(part).exists() or not _MODULE.match(part) or Path(part).suffix in SUFFIXES:
            continue
        try:
            module = importlib.import_module(part)
        except Exception as exc:
            raise DefinitionError(part, "(module)", f"cannot import: {type(exc).__name__}: {exc}") from None
        except SystemExit:  # a module that exits at import is no agent module
            raise DefinitionError(part, "(module)", "cannot import: the module called sys.exit") from None
        defined = [value if isinstance(value, AgentDefinition) else value.definition
                   for value in vars(module).values()
                   if isinstance(value, AgentDefinition)
                   or isinstance(getattr(value, "definition", None), AgentDefinition)]
        if not defined:
            raise DefinitionError(part, "(module)", "defines no agent (use executor.sdk's @agent)")
        found.extend(defined)
    return found


class AgentCatalog:
    """Every loaded definition, by name and version."""

    def __init__(self, definitions: Iterable[AgentDefinition]) -> None:
        self._by_name: dict[str, dict[str, AgentDefinition]] = {}
        for definition in definitions:
            versions = self._by_name.setdefault(definition.name, {})
            if definition.version in versions:
                raise DefinitionError(definition.source, "version",
                                      f"{definition.version!r} is defined twice")
            versions[definition.version] = definition

    @classmethod
    def load(cls, spec: str) -> AgentCatalog:
        files = definition_files(spec)
        in_code = definition_modules(spec)
        if not files and not in_code:
            raise DefinitionError(spec, "(file)", "no agent definitions (*.yaml, *.yml, *.toml, or a module) found")
        return cls([*(load_file(path) for path in files), *in_code])

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def replace(self, definition: AgentDefinition) -> None:
        """Puts `definition` in place of the loaded one of its name and version (its MCP tools listed)."""
        self._by_name[definition.name][definition.version] = definition

    def all(self) -> list[AgentDefinition]:
        return [d for versions in self._by_name.values() for d in versions.values()]

    def get(self, name: str, version: str = "") -> AgentDefinition | None:
        """The named version, or (no version asked) the only one / the last in natural order."""
        versions = self._by_name.get(name)
        if not versions:
            return None
        if version:
            return versions.get(version)
        return versions[max(versions, key=_natural)]


def _natural(text: str) -> list[Any]:
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", text)]
