"""The fast paths of DCPG's training step against slow, obvious references kept here: the packed caption decoder
(``nn.Conv1d`` over every padded position, one branch at a time), the word features looked up in word_fc of the
vocabulary, and the whole method as it was first written (:class:`ReferenceDCPG`: the padded text GRU of the
policy, ``nn.GRU`` on the packed captions, two instance cross-entropies, every item's image encoded at
evaluation): a few training steps from the same seed give the same losses within float tolerance.
``benchmarks/dcpg_step_speed.py`` times :class:`ReferenceDCPG` against :class:`DCPG`."""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlattention.engine.method import DataInfo, StepOutput
from rlattention.methods.dcpg import DCPG, CaptionDecoder, DCPGConfig, hardest_negative_triplet
from rlattention.rl import leave_one_out_baseline
from rlattention.rl.discrete_continuous import dcpg_losses, in_batch_retrieval_reward

R, FEAT, VOCAB, L = 6, 69, 63, 26  # the digit scenes: 6 regions of 69 values, 63 token ids, 26 tokens at most


# ---------------------------------------------------------------- references


def reference_decoding_loss(decoder: CaptionDecoder, embedding: Tensor, tokens: Tensor) -> Tensor:
    """The text-decoding loss over every padded position with ``nn.Conv1d`` (ignore_index=0)."""
    inp, target = tokens[:, :-1], tokens[:, 1:]
    x = (decoder.words(inp) + decoder.cond(embedding)[:, None]).transpose(1, 2)  # (B, W, L-1)
    for conv in decoder.convs:
        x = x + F.glu(conv(F.pad(x, (decoder.kernel - 1, 0))), dim=1)
    logits = decoder.out(x.transpose(1, 2))
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=0)


def _padded_gru_states(policy, x: Tensor, mask: Tensor | None) -> Tensor:
    return policy.gru(x)[0]  # the GRU over every position, padding included


class ReferenceDCPG(DCPG):
    """DCPG's training step and evaluation as first written: the same parameters, losses and random draws as
    :class:`DCPG`, computed the slow, obvious way."""

    def __init__(self, cfg: DCPGConfig, info: DataInfo) -> None:
        super().__init__(cfg, info)
        for policy in (self.image_policy, self.text_policy):
            if policy is not None:
                policy.gru_states = types.MethodType(_padded_gru_states, policy)

    def word_features(self, tokens: Tensor) -> Tensor:
        return self.word_fc(self.word_embedding(tokens))

    def _fuse(self, x: Tensor, mask: Tensor | None, policy, gru: nn.GRU, deterministic: bool):
        out = None
        if policy is not None:
            out = policy(x if self.cfg.pg_to_features else x.detach(), mask, deterministic=deterministic)
            x = x * (self.cfg.lam * out.attention.unsqueeze(-1))
        else:
            x = x * (self.cfg.lam * self.fixed_attention)
        if mask is None:
            h, _ = gru(x)
            last, mean = h[:, -1], x.mean(1)
        else:
            lengths = mask.sum(1).clamp(min=1)
            packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
            _, h_n = gru(packed)
            last = h_n[-1]
            mean = (x * mask.unsqueeze(-1)).sum(1) / lengths.unsqueeze(-1).to(x.dtype)
        return F.normalize(last + mean, dim=-1), out

    def forward(self, images: Tensor, targets: Tensor) -> StepOutput:
        cfg = self.cfg
        ids, tokens = targets[:, 0], targets[:, 1:]
        img, img_pg = self.encode_images(images, deterministic=False)
        txt, txt_pg = self.encode_texts(tokens, deterministic=False)
        sims = img @ txt.T
        same = ids[:, None] == ids[None, :]
        terms = {"triplet": hardest_negative_triplet(sims, same, cfg.margin)}
        if self.instance is not None:
            terms["instance"] = cfg.instance_weight * (
                F.cross_entropy(self.instance(img), ids) + F.cross_entropy(self.instance(txt), ids)
            )
        if self.decoder is not None:
            terms["decoding"] = cfg.decoding_weight * (
                reference_decoding_loss(self.decoder, img, tokens) + reference_decoding_loss(self.decoder, txt, tokens)
            )
        stats = {}
        if img_pg is not None:
            r_img = in_batch_retrieval_reward(sims, same, cfg.reward)
            r_txt = in_batch_retrieval_reward(sims.T, same.T, cfg.reward)
            pg_rows = () if cfg.noise_matched else (("image", img_pg, r_img), ("text", txt_pg, r_txt))
            for name, out, r in pg_rows:
                b = leave_one_out_baseline(r, cfg.baseline_beta) if cfg.pg_baseline else None
                l_d, l_c = dcpg_losses(out, r, b)
                if cfg.pg in ("discrete", "discrete_continuous"):
                    terms[f"pg_d_{name}"] = cfg.pg_weight * l_d
                if cfg.pg in ("continuous", "discrete_continuous"):
                    terms[f"pg_c_{name}"] = cfg.pg_weight * l_c
            stats = {"reward": 0.5 * (r_img.mean() + r_txt.mean()), "reward_image": r_img.mean()}
        loss = sum(terms.values())
        stats["batch_r1"] = (sims.argmax(1) == torch.arange(len(ids), device=ids.device)).float().mean()
        return StepOutput(loss, terms=terms, stats=stats)

    def predict_batch(
        self, images: Tensor, targets: Tensor, mc_samples: int = 0, generator: torch.Generator | None = None
    ) -> Tensor:
        with torch.no_grad():
            img, _ = self.encode_images(images, deterministic=True)
            txt, _ = self.encode_texts(targets[:, 1:], deterministic=True)
        return torch.cat((img, txt), 1)


# ---------------------------------------------------------------- data


def random_tokens(n: int, vocab: int, length: int, generator: torch.Generator, holes: bool = False) -> Tensor:
    """``<start> w ... <end>`` captions of 3..length tokens padded with 0 to ``length`` (``holes``: some 0s
    inside the captions too, which the decoder must ignore like padding)."""
    lengths = torch.randint(3, length + 1, (n,), generator=generator)
    tokens = torch.randint(4, vocab, (n, length), generator=generator)
    tokens[:, 0] = 1
    tokens[torch.arange(n), lengths - 1] = 2
    tokens[torch.arange(length)[None] >= lengths[:, None]] = 0
    if holes:
        inside = (torch.arange(length)[None] > 0) & (torch.arange(length)[None] < lengths[:, None] - 1)
        tokens[inside & (torch.rand(n, length, generator=generator) < 0.2)] = 0
    return tokens


def scene_batch(n_images: int, batch: int, seed: int) -> tuple[Tensor, Tensor]:
    """A batch of caption items in the digit-scene layout: ``(batch, 1, R, FEAT)`` and ``(batch, 1 + L)``."""
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(n_images, 1, R, FEAT, generator=g)
    ids = torch.randint(0, n_images, (batch,), generator=g)
    return features[ids], torch.cat((ids[:, None], random_tokens(batch, VOCAB, L, g)), 1)


# ---------------------------------------------------------------- the decoder


@pytest.mark.parametrize("vocab", [12, 400])  # fewer words than packed positions (a table of the words) or more
@pytest.mark.parametrize(("layers", "kernel"), [(2, 3), (1, 3), (3, 2), (2, 4), (2, 1)])
@pytest.mark.parametrize("holes", [False, True])
def test_packed_decoder_equals_the_dense_convolutions(vocab, layers, kernel, holes):
    torch.manual_seed(0)
    decoder = CaptionDecoder(vocab, 16, 12, layers, kernel).double()
    g = torch.Generator().manual_seed(1)
    tokens = random_tokens(9, vocab, 11, g, holes=holes)
    embeddings = [torch.randn(9, 16, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    expected = sum(reference_decoding_loss(decoder, e, tokens) for e in embeddings)
    expected_grads = torch.autograd.grad(expected, [*decoder.parameters(), *embeddings])
    got = decoder.loss_sum(embeddings, tokens)
    assert torch.allclose(got, expected, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad(got, [*decoder.parameters(), *embeddings])
    for a, b in zip(grads, expected_grads, strict=True):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)
    one = decoder.loss(embeddings[0], tokens)
    assert torch.allclose(one, reference_decoding_loss(decoder, embeddings[0], tokens), rtol=1e-12, atol=1e-12)
    assert decoder.words.weight.grad is None  # autograd.grad only


def test_packed_decoder_gives_the_padding_word_no_gradient():
    torch.manual_seed(0)
    decoder = CaptionDecoder(12, 8, 6, 2)
    tokens = random_tokens(7, 12, 9, torch.Generator().manual_seed(2), holes=True)
    decoder.loss_sum((torch.randn(7, 8), torch.randn(7, 8)), tokens).backward()
    assert decoder.words.weight.grad[0].abs().max() == 0 and decoder.words.weight.grad[4:].abs().sum() > 0


# ---------------------------------------------------------------- the method


def _models(seed: int = 0, **overrides) -> tuple[DCPG, ReferenceDCPG]:
    info = DataInfo((1, R, FEAT), 40, {"vocab_size": VOCAB})
    torch.manual_seed(seed)
    fast = DCPG(DCPGConfig(**overrides), info)  # the real sizes (embed 256, word_dim 300, 100 bins, 2 heads)
    ref = ReferenceDCPG(DCPGConfig(**overrides), info)
    ref.load_state_dict(fast.state_dict())
    return fast, ref


def test_word_features_lookup_equals_word_fc_of_every_token():
    fast, ref = _models()
    tokens = random_tokens(20, VOCAB, L, torch.Generator().manual_seed(3))
    assert fast.word_embedding.num_embeddings <= tokens.numel()  # the lookup path
    assert torch.allclose(fast.word_features(tokens), ref.word_features(tokens), atol=1e-6)
    assert torch.equal(fast.word_features(tokens[:1, :5]), ref.word_features(tokens[:1, :5]))  # few tokens: direct


@pytest.mark.parametrize(
    "overrides",
    [{}, {"pg": "none"}, {"pg_baseline": True, "mu_grad": "none"}, {"pg": "continuous", "heads": 1}],
    ids=["dcpg", "baseline", "pg_baseline", "continuous"],
)
def test_training_steps_match_the_reference(overrides):
    fast, ref = _models(**overrides)
    optimisers = {id(m): torch.optim.Adam(m.parameters(), lr=4e-4) for m in (fast, ref)}
    for step in range(3):
        images, targets = scene_batch(40, 48, seed=10 + step)
        outs = {}
        for model in (fast, ref):
            torch.manual_seed(100 + step)  # the same exploration noise
            out = model(images, targets)
            optimisers[id(model)].zero_grad()
            out.loss.backward()
            optimisers[id(model)].step()
            outs[id(model)] = out
        a, b = outs[id(fast)], outs[id(ref)]
        assert set(a.terms) == set(b.terms)
        for key in a.terms:
            assert a.terms[key].item() == pytest.approx(b.terms[key].item(), rel=1e-4, abs=1e-5), (step, key)
        assert a.loss.item() == pytest.approx(b.loss.item(), rel=1e-5)
        assert float(a.stats["batch_r1"]) == float(b.stats["batch_r1"])


def test_evaluation_encodes_each_image_once_with_the_same_result(monkeypatch):
    fast, ref = _models()
    fast.eval(), ref.eval()
    g = torch.Generator().manual_seed(4)
    features = torch.randn(8, 1, R, FEAT, generator=g)
    ids = torch.arange(8).repeat_interleave(5)  # 5 captions per image, as in an evaluation batch
    targets = torch.cat((ids[:, None], random_tokens(40, VOCAB, L, g)), 1)
    encoded = []
    original = DCPG.encode_images

    def counting(self, regions, deterministic):
        encoded.append(len(regions))
        return original(self, regions, deterministic)

    monkeypatch.setattr(DCPG, "encode_images", counting)
    got = fast.predict_batch(features[ids], targets)
    assert encoded == [8]
    assert torch.allclose(got, ref.predict_batch(features[ids], targets), atol=1e-6)
    other = features[ids].clone()
    other[1] += 1.0  # the same id with other features: every item is encoded
    encoded.clear()
    assert torch.allclose(fast.predict_batch(other, targets), ref.predict_batch(other, targets), atol=1e-6)
    assert encoded[0] == 40
