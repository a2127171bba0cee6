"""Action extraction from real-world model replies (last ``Action:`` line, else the last search/click)."""

from __future__ import annotations

import pytest

pytest.importorskip(
    "agent_trainer", reason="install the trainer: pip install -c constraints.txt -e services/trainer"
)

from agent_trainer.envs.webshop.actions import clean_reply, extract_action

CASES: list[tuple[str, str | None]] = [
    # plain
    ("Action: search[red running shoes]", "search[red running shoes]"),
    ("Action: click[b07xyz1234]", "click[b07xyz1234]"),
    ("click[buy now]", "click[buy now]"),
    # ReAct style with reasoning first
    (
        "Thought: The instruction asks for a waterproof jacket under $50. I should search for it.\n"
        "Action: search[waterproof jacket men]",
        "search[waterproof jacket men]",
    ),
    # case and spacing
    ("ACTION:   Search[ Wireless Earbuds ]", "search[Wireless Earbuds]"),
    ("action : click [Buy Now]", "click[Buy Now]"),
    ("Action：click[large]", "click[large]"),
    ("action:click[x-large]", "click[x-large]"),
    # end-of-turn tokens glued to the action
    ("Action: click[buy now]</s>", "click[buy now]"),
    ("Action: click[buy now]<|im_end|>", "click[buy now]"),
    ("Action: search[tea]<|eot_id|><|end_of_text|>", "search[tea]"),
    # markdown
    ("**Action:** click[b0qlop91ex]", "click[b0qlop91ex]"),
    ("- Action: `click[variety pack]`", "click[variety pack]"),
    ("> Action: click[< prev]", "click[< prev]"),
    ("### Action: click[next >]", "click[next >]"),
    # code fences, with the action on the line after a bare marker
    ("I will click the product.\nAction:\n```\nclick[b0123abcd]\n```", "click[b0123abcd]"),
    ("```\nAction: search[herbal tea non gmo]\n```", "search[herbal tea non gmo]"),
    ("```text\nclick[buy now]\n```", "click[buy now]"),
    # the last Action line wins over earlier ones and over actions in the reasoning
    (
        "Action: search[shoes]\nHmm, results are on the page already.\nAction: click[b0shoe0001]",
        "click[b0shoe0001]",
    ),
    (
        "I could do search[cheap shoes] or click[next >], but the best is\nAction: click[b0shoe0002]",
        "click[b0shoe0002]",
    ),
    # an Action line with no usable action falls back to the previous Action line
    ("Action: click[large]\nAction: I am not sure what to do", "click[large]"),
    # no Action line: the last search/click anywhere
    ("I think search[phone case] is wrong; instead click[b0case1234] then", "click[b0case1234]"),
    ("<think>maybe search[dress]</think>\n<action>click[b0dress001]</action>", "click[b0dress001]"),
    # trailing explanation after the action
    ("Action: click[buy now] because the options are all selected.", "click[buy now]"),
    # inner whitespace is collapsed
    ("Action: search[ long   sleeve\tshirt ]", "search[long sleeve shirt]"),
    # nothing usable
    ("", None),
    ("I don't know.", None),
    ("Action: buy the product", None),
    ("Action: click[]", None),
    ("Action: search[   ]", None),
    ("Action: open[b0123]", None),
    ("searching[shoes]", None),
    ("xclick[foo]", None),
    ("abYZ Eaugk R mixFXgingicraftertified spacikin oun67DB", None),
]


@pytest.mark.parametrize(("reply", "expected"), CASES)
def test_extract_action(reply: str, expected: str | None) -> None:
    assert extract_action(reply) == expected


def test_none_reply() -> None:
    assert extract_action(None) is None


def test_clean_reply_removes_special_tokens_and_fences() -> None:
    cleaned = clean_reply("```python\nclick[a]</s>\n```<|im_end|>")
    assert "```" not in cleaned and "</s>" not in cleaned and "<|im_end|>" not in cleaned
    assert "click[a]" in cleaned


def test_action_names_are_lower_cased_and_arguments_keep_their_case() -> None:
    assert extract_action("CLICK[Navy Blue]") == "click[Navy Blue]"
    assert extract_action("SEARCH[iPhone 15 Case]") == "search[iPhone 15 Case]"
