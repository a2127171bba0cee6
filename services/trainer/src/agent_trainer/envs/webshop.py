"""WebShop as the trainer sees it: its prompt and user turns, its action parser, its goals and splits, its rows, its
client and its spec, in one module (as every environment's module holds its own).

- **Prompt and user turns** (:data:`SYSTEM_PROMPT`, :func:`first_user_message`, :func:`step_text`): every text the
  policy sees, so the dataset, both verl routes and eval show the model exactly one format.
- **Parser** (:func:`extract_action`): the action on the **last** ``Action:`` line wins; without one, the **last**
  ``search[...]``/``click[...]`` anywhere in the reply. Real replies are messy, so extraction tolerates any case and
  spacing around the parts (``ACTION :  Click [ Buy Now ]`` gives ``click[Buy Now]``), markdown around the marker or
  the action (``**Action:**``, ``- Action:``, backticks, code fences), an action on the line *after* a bare
  ``Action:`` marker, and end-of-turn markers (``</s>``, ``<|im_end|>``, ...) and ``<action>`` tags. The action
  name is lower-cased (the env's grammar is case-sensitive) and the argument stripped (the env never trims); the
  argument's own case is kept. A reply without an action still steps the environment with
  :data:`UNPARSEABLE_ACTION` (an invalid action: the page stays, one more step), so the step limit stays the
  server's.
- **Tasks**: the goals of a goal set (``synthetic`` by default, or ``human``) of the prepared catalog; the splits are
  the goal ranges (test 0-499, val = "eval" 500-1499, train 1500-), so they need the catalog (``DataOptions``).
- **Rows** (:class:`WebShopRows`): the first page from the simulator itself, in process, on the run's catalog.
- **Client**: WebShop's own ``/v1`` protocol (goal sets, splits), ``webshop_env.client.WebShopClient``.
- **Rounds**: 24 model turns, each an env step: what the guides' ``max_assistant_turns = 25`` allows (verl stops
  after the 25th reply without sending it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from webshop_env.client import WebShopClient

from ..reward import is_success
from .rows import RowBuilder
from .spec import DataError, DataOptions, EnvSpec, Outcome, Parsed

ENV_ID = "webshop"
#: Model turns per episode: the env steps the guides' 25 assistant turns allow.
MAX_ROUNDS = 24
DEFAULT_GOAL_SET = "synthetic"
ABILITY = "agent/webshop"
#: Each split's goal range by its WebShop name (``webshop_env``'s ``SPLITS``: test, eval, train).
SPLIT_NAMES = {"train": "train", "val": "eval", "test": "test"}

# ---- what the policy sees -------------------------------------------------------------------------------------
SYSTEM_PROMPT = """\
You are a shopping agent on WebShop, a simplified shopping website. You are given an instruction that \
describes a product to buy. Find the product that best matches it (type, attributes, options and price) \
and buy it.

Each turn you see the current page and the actions available on it. Answer with exactly one action.

Actions:
- search[<keywords>]: search for products; only possible when the page has a search bar.
- click[<element>]: click one of the clickable elements listed for the page, written exactly as listed \
(product IDs such as b0123abcd, options such as "large" or "navy blue", and the buttons "back to search", \
"next >", "< prev", "description", "features", "reviews" and "buy now").

Choose an option (size, color, ...) on the product page by clicking it before you click "buy now". \
The episode ends when you click "buy now". You may think briefly first; then end your reply with one \
line of the form
Action: <action>

Example.
Page: WebShop [SEP] Instruction: [SEP] i need a red cotton t-shirt for men in size large, and price lower \
than 30.00 dollars [SEP] Search
Available actions: search[<keywords>]
Reply: I should search for the product first.
Action: search[red cotton t-shirt men]
Page: ... [SEP] B07ABC1234 [SEP] Men's Cotton Crew T-Shirt [SEP] $12.99 [SEP] ...
Available actions: click[back to search], click[next >], click[b07abc1234], ...
Reply: The first result is a men's cotton t-shirt under 30 dollars.
Action: click[b07abc1234]
Page: ... [SEP] size [SEP] small [SEP] large [SEP] color [SEP] red [SEP] blue [SEP] ... [SEP] Buy Now
Available actions: click[large], click[red], click[buy now], ...
Reply: Action: click[large]
(then click[red], then click[buy now])"""

INVALID_REPLY_MESSAGE = (
    "Your reply did not contain a valid action. End your reply with one line of the form "
    "`Action: search[<keywords>]` or `Action: click[<element>]`, using an element listed below."
)
INVALID_ACTION_MESSAGE = "The action {action} is not available on this page, so nothing happened. Use one of the actions listed below."
EPISODE_DONE_MESSAGE = "You bought a product; the episode is over."
EPISODE_TRUNCATED_MESSAGE = "The step limit was reached; the episode is over."


def available_actions_text(available_actions: Mapping[str, Any], max_clickables: int = 0) -> str:
    """``search[<keywords>], click[a], click[b], ...``: the actions as the model should write them."""
    parts: list[str] = []
    if available_actions.get("has_search_bar"):
        parts.append("search[<keywords>]")
    clickables: Sequence[str] = [c for c in available_actions.get("clickables", []) if c != "search"]
    if max_clickables and len(clickables) > max_clickables:
        clickables = clickables[:max_clickables]
    parts.extend(f"click[{label}]" for label in clickables)
    return ", ".join(parts) if parts else "(none)"


def page_text(observation: str, available_actions: Mapping[str, Any], max_observation_chars: int = 0) -> str:
    """The page and its actions, as every user turn shows them."""
    if max_observation_chars and len(observation) > max_observation_chars:
        observation = observation[:max_observation_chars] + " ...(truncated)"
    return f"Page: {observation}\nAvailable actions: {available_actions_text(available_actions)}"


def first_user_message(instruction: str, observation: str, available_actions: Mapping[str, Any]) -> str:
    """The first user turn: the instruction and the start page."""
    return f"Instruction: {instruction}\n{page_text(observation, available_actions)}"


def initial_messages(
    instruction: str, observation: str, available_actions: Mapping[str, Any]
) -> list[dict[str, str]]:
    """The chat a trajectory starts from (the dataset's ``prompt`` column)."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": first_user_message(instruction, observation, available_actions)},
    ]


def step_text(
    observation: str,
    available_actions: Mapping[str, Any],
    *,
    action: str | None,
    valid: bool,
    done: bool = False,
    truncated: bool = False,
    max_observation_chars: int = 0,
) -> str:
    """The user turn after a step: a note on what went wrong (if anything), then the page and its actions; after
    the last step, that the episode is over (verl 0.7.1's ``ToolAgentLoop`` appends the interaction's answer to a
    step that ends the episode too).

    ``action`` is None when the reply named no action at all (the corrective message).
    """
    if done:
        return EPISODE_TRUNCATED_MESSAGE if truncated else EPISODE_DONE_MESSAGE
    lines = []
    if action is None:
        lines.append(INVALID_REPLY_MESSAGE)
    elif not valid:
        lines.append(INVALID_ACTION_MESSAGE.format(action=action))
    lines.append(page_text(observation, available_actions, max_observation_chars))
    return "\n".join(lines)


# ---- the parser -----------------------------------------------------------------------------------------------
ACTION_NAMES = ("search", "click")
#: What is sent to the env for a reply with no parseable action: the env treats it as an invalid action
#: (page unchanged, reward 0, one more step), so the step counter and step limit stay the server's.
UNPARSEABLE_ACTION = "noop[no action in reply]"

# One action: name, optional spaces, [argument without brackets or newlines].
_ACTION = re.compile(r"\b(search|click)\s*\[([^\[\]\n]*)\]", re.IGNORECASE)
# The marker: "Action:" (or full-width colon) at a line start, after optional markdown/list decoration.
_MARKER = re.compile(r"^[ \t>*_#`\-]*action[ \t*_`]*[:：]", re.IGNORECASE | re.MULTILINE)
# End-of-turn / special tokens that models leak into text.
_SPECIAL = re.compile(
    r"</s>|<s>|<\|im_end\|>|<\|im_start\|>|<\|endoftext\|>|<\|eot_id\|>|<\|end_of_text\|>|<\|end\|>"
    r"|<\|assistant\|>|<eos>|<end_of_turn>|</?action>",
    re.IGNORECASE,
)
_FENCE = re.compile(r"^[ \t]*```[^\n]*$", re.MULTILINE)


def clean_reply(text: str) -> str:
    """The reply without special tokens, ``<action>`` tags and code-fence lines (their content stays)."""
    text = _SPECIAL.sub("\n", text)
    return _FENCE.sub("", text)


def _first_action(text: str) -> str | None:
    for match in _ACTION.finditer(text):
        action = _normalise(match)
        if action is not None:
            return action
    return None


def _last_action(text: str) -> str | None:
    for match in reversed(list(_ACTION.finditer(text))):
        action = _normalise(match)
        if action is not None:
            return action
    return None


def _normalise(match: re.Match[str]) -> str | None:
    argument = " ".join(match.group(2).split())
    if not argument:
        return None
    return f"{match.group(1).lower()}[{argument}]"


def extract_action(reply: str | None) -> str | None:
    """The action a reply asks for (``search[...]`` or ``click[...]``), or None when it names none."""
    if not reply:
        return None
    text = clean_reply(reply)
    markers = list(_MARKER.finditer(text))
    if markers:
        # Walk back from the last marker: a marker with no usable action after it (e.g. a trailing
        # "Action:" the model never finished) falls back to the previous one, then to the whole reply.
        for index in range(len(markers) - 1, -1, -1):
            start = markers[index].end()
            end = markers[index + 1].start() if index + 1 < len(markers) else len(text)
            action = _first_action(text[start:end])
            if action is not None:
                return action
    return _last_action(text)


def is_search(action: str) -> bool:
    return action.startswith("search[")


def step_was_valid(action: str | None, info: Mapping[str, Any]) -> bool:
    """A turn is valid when the reply held an action and the env accepted it (``info.valid``)."""
    return action is not None and bool(info.get("valid", True))


def parse_goal(kwargs: Mapping[str, Any]) -> int:
    """A row's goal index from ``goal`` (or ``session_id``/``goal_id``; int, ``"12"`` or ``"webshop_12"``)."""
    for key in ("goal", "session_id", "goal_id"):
        value = kwargs.get(key)
        if value is None:
            continue
        if isinstance(value, bool):
            break
        if isinstance(value, int):
            return value
        text = str(value).strip().rsplit("_", 1)[-1]
        if text.isdigit():
            return int(text)
        raise ValueError(
            f"interaction_kwargs[{key!r}] = {value!r} is not a goal index (int or 'webshop_<N>')"
        )
    raise ValueError(
        f"interaction_kwargs has no goal: expected 'goal' (or 'session_id'), got keys {sorted(kwargs)}; "
        "rebuild the dataset with `agent-train data`"
    )


# ---- the spec's parts ---------------------------------------------------------------------------------------
def parse(reply: str) -> Parsed:
    action = extract_action(reply)
    return Parsed(action=action or UNPARSEABLE_ACTION, well_formed=action is not None)


def first_message(first: Mapping[str, Any]) -> str:
    return first_user_message(
        first.get("instruction", ""), first.get("observation", ""), first.get("available_actions") or {}
    )


def step_message(
    result: Mapping[str, Any], parsed: Parsed, outcome: Outcome, max_observation_chars: int
) -> str:
    return step_text(
        result.get("observation", ""),
        result.get("available_actions") or {},
        action=parsed.action if parsed.well_formed else None,
        valid=outcome.valid,
        done=outcome.done,
        truncated=bool((result.get("info") or {}).get("truncated")),
        max_observation_chars=max_observation_chars,
    )


def outcome(result: Mapping[str, Any], parsed: Parsed) -> Outcome:
    info = result.get("info") or {}
    done = bool(result.get("done"))
    reward = float(result.get("reward") or 0.0)
    return Outcome(
        env_reward=reward,
        done=done,
        success=done and is_success(reward),
        valid=parsed.well_formed and bool(info.get("valid", True)),
        finished=done and "reward_info" in info,  # a purchase, not the server's step-limit truncation
    )


def reset_options(fields: Mapping[str, Any], default_goal_set: str | None) -> dict[str, Any]:
    """The goal set (the row's, else the interaction's or agent loop's ``goal_set``, else the server's default)
    and the split the server checks the goal against."""
    return {"goal_set": fields.get("goal_set") or default_goal_set, "split": fields.get("split") or None}


def connect(url: str, **options: Any) -> WebShopClient:
    """WebShop's own ``/v1`` client (goal sets, splits, goal summaries)."""
    return WebShopClient(url, **options)


def as_action(action: str) -> str:
    """WebShop's scripted policies reply with the bare action (what the parser reads)."""
    return action


# ---- goals, splits and rows -----------------------------------------------------------------------------------
def catalog_of(data: DataOptions) -> Any:
    """The prepared catalog ``data`` names, opened once (``data.catalog`` keeps it)."""
    from webshop_env.catalog.store import PreparedCatalog, open_catalog

    if data.catalog is None:
        raise DataError("webshop needs --catalog (its goals come from the prepared catalog)")
    if not isinstance(data.catalog, PreparedCatalog):
        data.catalog = open_catalog(data.catalog)
    return data.catalog


def split_goal_ids(catalog: Any, split: str, goal_set: str) -> list[int]:
    """Goal indices of ``split`` in ``goal_set`` (the goal ranges: test 0-499, eval 500-1499, train 1500+)."""
    from webshop_env.core.goals import SPLITS, split_range

    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    if goal_set not in catalog.goal_sets:
        raise DataError(f"the catalog has no {goal_set!r} goals; it has {', '.join(catalog.goal_sets)}")
    total = catalog.goal_count(goal_set)
    ids = list(split_range(split, total))
    if not ids:
        raise DataError(
            f"the {split} split of the {goal_set} goals is empty: this catalog has {total} {goal_set} goals and "
            f"the {split} split starts at goal {SPLITS[split][0]}; use another --goal-set or a larger catalog"
        )
    return ids


def split_rule(split: str, data: DataOptions) -> list[int]:
    """The goals of ``split`` (train, val, test) in the data's goal set of its catalog."""
    return split_goal_ids(catalog_of(data), SPLIT_NAMES[split], data.goal_set)


def build_row(
    env: Any, goal: int, goal_set: str, split: str | None, index: int, agent_name: str
) -> dict[str, Any]:
    """One row for goal ``goal`` (its first page from the simulator ``env``, a ``WebShopEnv``), in the columns of
    ``agent-train data``'s WebShop files: ``reward_model.ground_truth`` is the goal's product (verl's reward
    manager needs one), ``interaction_kwargs`` what ``start_interaction`` reads. ``split`` (or None) is what the
    server checks the goal against at reset."""
    first = env.reset(goal, goal_set=goal_set)
    record = env.goal(goal_set, goal)
    return {
        "data_source": ENV_ID,
        "agent_name": agent_name,
        "prompt": initial_messages(first.instruction, first.observation, first.available_actions),
        "ability": ABILITY,
        "reward_model": {"style": "interaction", "ground_truth": record.asin},
        "extra_info": {
            "index": index,
            "goal": goal,
            "goal_set": goal_set,
            "split": split,
            "instruction": first.instruction,
            "interaction_kwargs": {"name": ENV_ID, "goal": goal, "goal_set": goal_set, "split": split},
        },
    }


class WebShopRows(RowBuilder):
    """WebShop's rows: the first page from the simulator on the run's catalog, in process (no service needed)."""

    def open(self) -> None:
        from webshop_env.core.env import WebShopEnv

        self.catalog = catalog_of(self.data)
        self.core = WebShopEnv(self.catalog)

    def data_fingerprint(self) -> str:
        return f"{ENV_ID}:{self.catalog.fingerprint}"

    @property
    def source(self) -> str | None:
        return None

    def prefetch(self, tasks: Iterable[int], split: str) -> None:
        """Nothing to fetch: a reset is a lookup in the memory-mapped catalog."""

    def close(self) -> None:
        """Nothing to stop."""

    def row(self, task: int, split: str, index: int) -> dict[str, Any]:
        row = build_row(self.core, task, self.data.goal_set, SPLIT_NAMES[split], index, self.agent_name)
        row["extra_info"] |= {"env": ENV_ID, "task": task}
        row["extra_info"]["interaction_kwargs"]["task"] = task
        return row


SPEC = EnvSpec(
    env_id=ENV_ID,
    title="WebShop: find and buy the product an instruction describes (search and click on a shopping site)",
    system_prompt=SYSTEM_PROMPT,
    max_rounds=MAX_ROUNDS,
    parse=parse,
    first_message=first_message,
    step_message=step_message,
    outcome=outcome,
    reward_rule="the purchase's reward in [0, 1] (attributes, options, price and type matched), paid when "
    '"buy now" is clicked; 0 without a purchase',
    success_rule="the purchase earned the full reward 1.0",
    task_of=parse_goal,  # goal (or session_id/goal_id; "webshop_12" works), as the interaction reads it
    display_name="WebShop",
    split_rule=split_rule,
    reset_options=reset_options,
    connect=connect,
    rows=WebShopRows,
    scripted_reply=as_action,
    checks_opening=False,
)
