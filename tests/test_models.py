import pytest
import torch

from course_utils.data import load_digits_split
from course_utils.models import MLP, GPTConfig, ResBlock, SmallResNet, TinyGPT, TransformerBlock


def test_resblock_keeps_shape():
    block = ResBlock(8)
    x = torch.randn(2, 8, 6, 6)
    assert block(x).shape == x.shape


def test_small_resnet_learns_the_digits_quickly():
    torch.manual_seed(0)
    split = load_digits_split()
    model = SmallResNet(width=16)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    x, y = split.x_train[:512], split.y_train[:512]
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert model(split.x_test).shape == (len(split.x_test), 10)


def test_mlp_shapes_and_bad_depth():
    assert MLP(16, 32, 4, depth=3)(torch.randn(5, 16)).shape == (5, 4)
    with pytest.raises(ValueError):
        MLP(16, 32, 4, depth=0)


def test_transformer_block_is_causal_when_asked():
    torch.manual_seed(0)
    block = TransformerBlock(32, 4, causal=True).eval()
    x = torch.randn(1, 6, 32)
    y = block(x)
    x2 = x.clone()
    x2[:, -1] += 1.0  # change only the last position
    y2 = block(x2)
    torch.testing.assert_close(y[:, :-1], y2[:, :-1])  # earlier positions unaffected
    assert not torch.allclose(y[:, -1], y2[:, -1])
    with pytest.raises(ValueError, match="divisible"):
        TransformerBlock(30, 4)



@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("split", [1, 4, 8])
def test_block_with_past_keys_equals_the_full_forward(causal, split):
    """Running the last positions against the earlier ones' keys and values (the KV cache) gives
    what the whole sequence gives at those positions (tolerance 1e-5: only summation order differs),
    and the keys/values returned are the new positions' own, the ones a cache appends."""
    torch.manual_seed(0)
    block = TransformerBlock(32, 4, causal=causal).eval()
    x = torch.randn(3, 9, 32)
    with torch.no_grad():
        full = block(x)
        head, past = block.forward_cached(x[:, :split])
        tail, new = block.forward_cached(x[:, split:], past)
        _, whole = block.forward_cached(x)
    if causal:  # earlier positions never see later ones
        torch.testing.assert_close(head, full[:, :split], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(tail, full[:, split:], atol=1e-5, rtol=1e-5)
    assert past[0].shape == (3, 4, split, 8) and new[0].shape == (3, 4, 9 - split, 8)
    for i in range(2):  # keys, values: the cache after both calls is the whole sequence's
        torch.testing.assert_close(torch.cat([past[i], new[i]], dim=2), whole[i])


def test_block_mask_with_past_replaces_the_causal_rule():
    """A mask hides cached positions per row (a batch whose rows hold different amounts of past):
    row 0 sees 2 of its 5 cached positions, which equals running it with those 2 alone."""
    torch.manual_seed(0)
    block = TransformerBlock(16, 2, causal=True).eval()
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        _, past = block.forward_cached(x[:, :5])
        visible = torch.tensor([[True, True, False, False, False, True], [True] * 6])[:, None, None, :]
        masked, _ = block.forward_cached(x[:, 5:], past, visible)
        short = block(torch.cat([x[:1, :2], x[:1, 5:]], dim=1))[:, -1:]
    torch.testing.assert_close(masked[:1], short, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(masked[1:], block(x)[1:, 5:], atol=1e-5, rtol=1e-5)


def test_attention_maths_exists_once():
    """The block's attention is the only one: the GPT's forward, prefill and decoding step, the
    servers and the tools call the model's methods and never repeat the maths or reach into a
    block's layers (issue 16)."""
    import ast

    from course_utils import config

    home = "course_utils/models/transformer.py"
    # exercise checkers may compare a learner's attention with torch's (exercise 11.attention's reference)
    teaching = "course_utils/exercises/"
    block_parts = {"qkv", "ln1", "ln2", "n_heads"}
    offenders = []
    for folder in ("course_utils", "tools"):
        for path in sorted((config.REPO_ROOT / folder).rglob("*.py")):
            name = path.relative_to(config.REPO_ROOT).as_posix()
            if name == home or name.startswith(teaching):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Attribute) and node.attr == "scaled_dot_product_attention":
                    offenders.append(f"{name}:{node.lineno} calls scaled_dot_product_attention")
                if (isinstance(node, ast.Attribute) and node.attr in block_parts
                        and not (isinstance(node.value, ast.Name) and node.value.id == "self")):
                    offenders.append(f"{name}:{node.lineno} reaches into a block (.{node.attr})")
    assert not offenders, offenders
    # and the scan sees the old shape of the copies it replaced
    old = "q, k, v = blk.qkv(blk.ln1(x)).split(c, dim=2)\ny = F.scaled_dot_product_attention(q, k, v)\n"
    attrs = {n.attr for n in ast.walk(ast.parse(old)) if isinstance(n, ast.Attribute)}
    assert {"qkv", "ln1", "scaled_dot_product_attention"} <= attrs

def small_gpt(**kw):
    torch.manual_seed(0)
    return TinyGPT(GPTConfig(vocab_size=20, block_size=8, n_layer=1, n_head=2, n_embd=16, **kw)).eval()


def test_gpt_forward_loss_and_tied_head():
    gpt = small_gpt()
    idx = torch.randint(0, 20, (3, 8))
    assert gpt(idx).shape == (3, 8, 20)
    assert gpt.head.weight is gpt.tok_emb.weight
    loss = gpt.loss(idx, idx)
    assert loss.item() == pytest.approx(torch.log(torch.tensor(20.0)).item(), rel=0.1)
    with pytest.raises(ValueError, match="block_size"):
        gpt(torch.zeros(1, 9, dtype=torch.long))


def test_gpt_stream_matches_generate_greedy():
    gpt = small_gpt()
    prompt = torch.tensor([1, 2, 3])
    streamed = list(gpt.stream(prompt, 12, temperature=0))  # longer than block_size: crops context
    full = gpt.generate(prompt.view(1, -1), 12, temperature=0)
    assert streamed == full[0, 3:].tolist()
    assert all(isinstance(t, int) and 0 <= t < 20 for t in streamed)


def test_gpt_stream_is_lazy():
    """Each token costs one forward pass, run only when the caller asks for that token."""
    gpt = small_gpt()
    forwards = []
    gpt.register_forward_hook(lambda *_: forwards.append(1))
    it = gpt.stream(torch.tensor([1]), 1000)
    assert forwards == []  # nothing runs before the first token is asked for
    first = next(it)
    assert isinstance(first, int) and len(forwards) == 1
    next(it)
    assert len(forwards) == 2


def test_importing_the_models_does_not_import_transformers():
    """transformers (slow to import, only for MiniLM) loads only when MiniLM is loaded."""
    import subprocess
    import sys

    code = ("import sys, course_utils.models, course_utils.serving; "
            "print(sorted(m for m in ('transformers', 'tokenizers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_gpt_sampling_is_reproducible_and_top_k_respected():
    gpt = small_gpt()
    a = gpt.generate(torch.zeros(2, 1, dtype=torch.long), 5, top_k=3,
                     generator=torch.Generator().manual_seed(1))
    b = gpt.generate(torch.zeros(2, 1, dtype=torch.long), 5, top_k=3,
                     generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and a.shape == (2, 6)


@pytest.mark.parametrize("bad", [-1, 2.5, "3", True])
def test_gpt_bad_max_new_tokens(bad):
    gpt = small_gpt()
    with pytest.raises(ValueError, match="max_new_tokens"):
        list(gpt.stream(torch.tensor([1]), bad))
    with pytest.raises(ValueError, match="max_new_tokens"):
        gpt.generate(torch.tensor([[1]]), bad)


def test_gpt_bad_temperature_and_batch():
    gpt = small_gpt()
    with pytest.raises(ValueError, match="temperature"):
        list(gpt.stream(torch.tensor([1]), 2, temperature=-1))
    with pytest.raises(ValueError, match="one sequence"):
        list(gpt.stream(torch.zeros(2, 3, dtype=torch.long), 2))


def test_models_compile_and_match_eager():
    model = SmallResNet(width=8).eval()
    x = torch.randn(4, 1, 8, 8)
    compiled = torch.compile(model, backend="aot_eager")
    torch.testing.assert_close(compiled(x), model(x))
