"""From tokens to text: incremental detokenizing with stop strings (textstream.py), a
request's events as pieces and results (results.py), chat and tool calls (chat.py,
toolcalls.py, toolstream.py)."""
