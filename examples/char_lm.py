"""A character-level language model: two causal transformer blocks over a short public-domain text.

Run with ``python -m examples.char_lm``. The text, ``examples/data/two_cities.txt`` (about 3 KB),
is the first four paragraphs of the opening chapter ("The Period", Book the First, Chapter I) of
Charles Dickens's *A Tale of Two Cities* (1859), in the public domain. Its distinct characters
are the vocabulary.

The model embeds each character (``nn.embedding``), adds the sinusoidal position encoding, runs two
pre-norm transformer blocks with causal masks (``nn.transformer_block(causal=True)``), a final
layer norm and a linear head to the vocabulary, and is trained with cross entropy to predict each
next character, with Adam. Training windows of ``SEQ + 1`` characters start at every character
(``stride`` 1), so the model sees each stretch of the text at every position of a window, as
sampling past the first window will show it; they are grouped into batches once, by a fixed
permutation, and each epoch is one ``run_many`` call over the batches in a seeded order.

Sampling continues a prompt one character at a time: a second routine computes the logits of a
single window with the trained parameters; the next character is drawn from
``softmax(logits / temperature)`` at the last filled position with a numpy generator seeded by
``--seed``. The causal mask makes the logits at a position independent of the cells after it,
so a window is filled from the left and the cells past the text are ignored. The same seed gives
the same text.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import ocannl as oc
from ocannl import data, nn, train
from ocannl.errors import OcannlError

TEXT_PATH = Path(__file__).with_name("data") / "two_cities.txt"
SEQ = 32
BATCH = 16
D_MODEL = 32
HEADS = 4
D_FF = 64
STRIDE = 1
EPOCHS = 20
LR = 3e-3


def load_text(path: Path = TEXT_PATH) -> str:
    return path.read_text(encoding="utf-8")


class Vocabulary:
    """The text's distinct characters, sorted, and the maps between characters and ids."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        unknown = sorted(set(text) - set(self.index))
        if unknown:
            raise OcannlError(f"examples.char_lm: characters {unknown!r} are not in the training text's vocabulary")
        return np.array([self.index[c] for c in text], np.int32)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


class CharLM:
    """Embedding + positions -> ``blocks`` causal transformer blocks (two by default) -> layer norm
    -> linear head; a factory
    whose instance keeps its blocks, so the training and the sampling graphs share parameters."""

    def __init__(self, vocab: int, seq: int = SEQ, d_model: int = D_MODEL, heads: int = HEADS, d_ff: int = D_FF,
                 label: str = "char_lm", blocks: int = 2):
        self.seq = seq
        self.embed = nn.embedding(vocab, d_model, label=f"{label}_embed")
        self.positions = nn.sinusoidal_position_encoding(d_model, seq)
        self.blocks = [nn.transformer_block(num_heads=heads, d_k=d_model // heads, d_ff=d_ff,
                                            label=f"{label}_block{i}", causal=True) for i in range(blocks)]
        self.norm = nn.layer_norm(f"{label}_norm")
        self.head = nn.linear(vocab, label=f"{label}_head")

    @property
    def params(self) -> list[oc.Tensor]:
        blocks = [p for b in self.blocks for p in b.params]
        return [*self.embed.params, *blocks, *self.norm.params, *self.head.params]

    def __call__(self, ids: oc.Tensor) -> oc.Tensor:
        """Logits for ids of batch ``[..., seq]``: batch ``[..., seq]``, output ``[vocab]``."""
        h = self.embed(ids) + self.positions
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


def windows(ids: np.ndarray, seq: int, batch: int, seed: int, stride: int = STRIDE) -> np.ndarray:
    """Windows of ``seq + 1`` ids starting every ``stride`` ids, shuffled by ``seed`` and grouped into
    ``(n_batches, batch, seq + 1)``; the windows that do not fill a last batch are left out."""
    if stride < 1:
        raise OcannlError(f"examples.char_lm: the window stride must be at least 1, got {stride}")
    starts = np.arange(0, len(ids) - seq, stride)
    starts = np.random.default_rng(seed).permutation(starts)
    n_batches = len(starts) // batch
    if n_batches == 0:
        raise OcannlError(f"examples.char_lm: a text of {len(ids)} characters gives {len(starts)} windows of "
                          f"{seq + 1}, not a batch of {batch}")
    chosen = starts[:n_batches * batch]
    return data.batches(np.stack([ids[s:s + seq + 1] for s in chosen]), batch)


class Sampler:
    """A compiled forward pass over one window, to continue a prompt character by character."""

    def __init__(self, model: CharLM, vocab: Vocabulary, ctx: oc.Context):
        self.model, self.vocab, self.ctx = model, vocab, ctx
        self.window = oc.tensor(np.zeros((1, model.seq), np.int32), batch=2, label="sample_window")
        self.logits = model(self.window)
        self.routine = ctx.compile(self.logits)

    def next_logits(self, context: np.ndarray) -> np.ndarray:
        """The logits after the last of ``context`` (the last ``seq`` ids of it are read)."""
        tail = context[-self.model.seq:]
        window = np.zeros((1, self.model.seq), np.int32)
        window[0, :len(tail)] = tail
        self.window.set(window)
        self.routine.run()
        return self.ctx.get(self.logits.value).reshape(self.model.seq, -1)[len(tail) - 1]

    def sample(self, prompt: str, length: int, seed: int = 0, temperature: float = 0.8) -> str:
        """``prompt`` followed by ``length`` drawn characters; the same ``seed`` gives the same text."""
        if not prompt:
            raise OcannlError("examples.char_lm: sampling needs a prompt of at least one character")
        if temperature <= 0:
            raise OcannlError(f"examples.char_lm: the sampling temperature must be positive, got {temperature}")
        rng = np.random.default_rng(seed)
        ids = list(self.vocab.encode(prompt))
        for _ in range(length):
            logits = self.next_logits(np.array(ids, np.int32)).astype(np.float64) / temperature
            p = np.exp(logits - logits.max())
            ids.append(int(rng.choice(len(p), p=p / p.sum())))
        return self.vocab.decode(ids)


def train_char_lm(ctx: oc.Context | None = None, epochs: int = EPOCHS, seq: int = SEQ, batch: int = BATCH,
                  d_model: int = D_MODEL, heads: int = HEADS, d_ff: int = D_FF, lr: float = LR,
                  stride: int = STRIDE, text: str | None = None, seed: int = 0, log=None) -> dict:
    """Train; returns the per-epoch mean losses, the model, a :class:`Sampler` and timings."""
    oc.seed(seed)
    ctx = ctx or oc.Context.auto()
    text = load_text() if text is None else text
    vocab = Vocabulary(text)
    batches = windows(vocab.encode(text), seq, batch, seed, stride)
    n_batches = len(batches)
    onehot = np.eye(len(vocab), dtype=np.float32)

    start = time.perf_counter()
    batch_n = oc.IndexSymbol("batch_n", n_batches)
    inputs = oc.tensor(np.ascontiguousarray(batches[:, :, :seq]), batch=3, label="char_inputs")[batch_n]
    targets = oc.tensor(onehot[batches[:, :, 1:]], batch=3, label="char_targets")[batch_n]
    model = CharLM(len(vocab), seq=seq, d_model=d_model, heads=heads, d_ff=d_ff)
    loss = nn.cross_entropy(model(inputs), targets, label="loss")
    update = train.grad_update(loss)
    step = ctx.compile(update, train.adam_update(update, lr=lr))
    sampler = Sampler(model, vocab, ctx)
    compiled = time.perf_counter()

    order_rng = np.random.default_rng(seed + 1)
    epoch_losses: list[float] = []
    for epoch in range(epochs):
        losses = step.run_many(batch_n=order_rng.permutation(n_batches).tolist(), record=loss)
        epoch_losses.append(float(np.mean(losses)))
        if log is not None and (epoch + 1) % max(1, epochs // 10) == 0:
            log(f"epoch {epoch + 1:3d}: mean loss {epoch_losses[-1]:.4f}")
    done = time.perf_counter()
    return {"epoch_losses": epoch_losses, "model": model, "vocab": vocab, "sampler": sampler, "ctx": ctx,
            "n_batches": n_batches, "compile_s": compiled - start, "train_s": done - compiled}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompt", default="It was the ")
    parser.add_argument("--length", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--backend", default=None, help="interp, c, ... (default: the best available)")
    args = parser.parse_args(argv)
    ctx = oc.Context(args.backend) if args.backend else oc.Context.auto()
    print(f"Training the character LM (2 causal transformer blocks, d_model {D_MODEL}) on the "
          f"{ctx.backend_name} backend, {args.epochs} epochs.")
    result = train_char_lm(ctx, epochs=args.epochs, seed=args.seed, log=print)
    losses = result["epoch_losses"]
    print(f"compile {result['compile_s']:.2f} s, train {result['train_s']:.2f} s "
          f"({result['n_batches']} batches of {BATCH} windows of {SEQ})")
    print(f"mean loss: first epoch {losses[0]:.4f}, last epoch {losses[-1]:.4f} "
          f"(uniform guess: {np.log(len(result['vocab'])):.4f})")
    print("Sample:")
    print(result["sampler"].sample(args.prompt, args.length, seed=args.seed, temperature=args.temperature))


if __name__ == "__main__":
    main()
