"""Backends run decoder graphs over KV buffers allocated once (runtime/backends/protocol.py has
the contracts as code):

    PoolModel  run(slot, tokens, past_len, hidden, keep), run_rows(lo, tokens, pasts, hidden)
               over the slots of a `KVPool`: what the engine drives (ort.py `OrtModel`;
               single.py `SingleSequenceModel` around a Backend)
    Backend    run(tokens, past_len, hidden, keep) for one sequence (ort.py `OrtBackend`,
               trt.py `TrtBackend`)
    harness.py `SequenceHarness`: one sequence through a Backend with its own length pointer
               (export validation, graph tests, tools)

The speculation loop never knows which backend it drives.
"""
