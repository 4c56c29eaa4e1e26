"""Drafting policy: how many tokens to draft per row and step, from measured call costs
(adaptive.py, probed once and cached by cost_cache.py), per-bundle acceptance (store.py) and
the batch plan (plan.py)."""
