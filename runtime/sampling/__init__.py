"""The speculation math and what a request does to the logits: sampling and its keyed draws
(draws.py), exact verification (verify.py), penalties and logprobs (logits.py), grammars
(grammar.py) and the per-row processing that applies them (processing.py). Pure NumPy."""
