"""The EAGLE trainer (tools/train_eagle.py) learns what it is trained on."""

import pytest
import train_eagle
from train_eagle import agreement, features, generate_corpus, prompts, train

from specrt.export.eagle import head_module, target_features
from tiny import tiny_tokenizer


@pytest.fixture(scope="module")
def target(tiny_dirs):
    import transformers as tf

    return tf.AutoModelForCausalLM.from_pretrained(tiny_dirs["target"]).eval()


def test_trainer_learns_the_target(target):
    """A thousand steps on the target's own answers: the head fits what it was trained on
    (optimizer, losses and unrolled passes work) and is not worse than untrained on held-out
    text (a random tiny target is hard to generalize from 2k tokens; the real head's held-out
    numbers are in docs/benchmarks.md)."""
    tok = tiny_tokenizer()
    texts = [" ".join(f"w{3 + (7 * i + 5 * j) % 120}" for j in range(6)) for i in range(64)]
    seqs = generate_corpus(target, tok, texts, batch=16, max_new=32, echo=None)
    assert len(seqs) == 64 and all(len(s) > 10 for s in seqs)
    head = head_module(target)
    feats = features(target, seqs)
    before = agreement(head, seqs, feats)
    rep = train(head, target, seqs, minutes=5, max_steps=1000, held_out=8, echo=None)
    after = agreement(head, seqs, feats)
    assert rep["steps"] == 1000
    # (measured: loss 15.0 -> 10.0, agreement on the corpus 0.01 -> 0.14: a random 2-layer
    # target is hard for one layer to imitate, but a broken optimizer or loss stays at 0.01)
    first, last = rep["loss_first_last"]
    assert last < 0.75 * first, rep
    assert after[0] > before[0] + 0.08 and after[1] > before[1] + 0.05, (before, after, rep)
    assert rep["agreement_step1_step2"][0] >= rep["agreement_before"][0], rep
    assert len(prompts()) == len(set(prompts())) > 1000


def test_features_are_the_targets_final_norm_states(target):
    """The trainer and export validation read one feature function (specrt.export.eagle)."""
    import numpy as np
    import torch

    seq = np.array([1, 5, 9, 33, 7], dtype=np.int32)
    with torch.no_grad():
        want = target(torch.from_numpy(seq[None].astype(np.int64)), output_hidden_states=True).hidden_states[-1][0]
    assert train_eagle.features is target_features
    torch.testing.assert_close(features(target, [seq])[0], want)
