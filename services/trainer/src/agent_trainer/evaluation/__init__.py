"""Evaluation of WebShop policies (``agent-train eval``) and reports (``agent-train report``).

Light on purpose: nothing here imports torch or verl, so ``make demo`` runs the ``expert`` and ``random``
policies on any machine; the LLM policies only add ``httpx`` and the trainer's prompt and action modules.
"""
