"""What verl's turn limit means in environment steps: one definition for training, preflight and eval.

verl 0.7.1's ToolAgentLoop counts assistant replies: after the N-th reply it stops (``assistant_turns >=
max_assistant_turns``) before that reply reaches the interaction. So ``max_assistant_turns = N`` allows
N - 1 environment steps (actions), and a goal whose shortest plan has N actions can never be solved.
"""

from __future__ import annotations


def env_steps_for_turns(max_assistant_turns: int) -> int:
    """Environment steps (actions) a trajectory can take under ``multi_turn.max_assistant_turns``."""
    if max_assistant_turns < 2:
        raise ValueError(
            f"max_assistant_turns = {max_assistant_turns} allows no environment step (it must be at least 2)"
        )
    return max_assistant_turns - 1


# configs/webshop_grpo_{test,train}.yaml: multi_turn.max_assistant_turns = 25 (the guides' value) -> 24 steps
TRAINING_MAX_ASSISTANT_TURNS = 25
TRAINING_ENV_STEPS = env_steps_for_turns(TRAINING_MAX_ASSISTANT_TURNS)
