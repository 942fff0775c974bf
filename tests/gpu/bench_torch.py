#!/usr/bin/env python3
# PyTorch eager reference: the same pre-LN block (LN, QKV, SDPA, out-proj,
# residual, LN, MLP with tanh GELU, residual) with bf16 parameters and
# activations, forward then backward, FLOPs counted like bench_tblock.
import sys, time, torch
import torch.nn.functional as F

def bench(h, a, f, s, causal, n, reps=5):
    dev, dt = "cuda", torch.bfloat16
    P = lambda *shape: (torch.randn(*shape, device=dev, dtype=dt) * 0.02).requires_grad_()
    g1, b1, g2, b2 = [torch.ones(h, device=dev, dtype=dt, requires_grad=True) for _ in range(4)]
    wqkv, bqkv, wo, bo = P(3 * h, h), P(3 * h), P(h, h), P(h)
    w1, bb1, w2, bb2 = P(f, h), P(f), P(h, f), P(h)
    x = torch.randn(n, s, h, device=dev, dtype=dt, requires_grad=True)
    dy = torch.randn(n, s, h, device=dev, dtype=dt)
    def block(x):
        t = F.layer_norm(x, (h,), g1, b1, 1e-5)
        q, k, v = F.linear(t, wqkv, bqkv).view(n, s, 3, a, h // a).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
        xm = x + F.linear(o.transpose(1, 2).reshape(n, s, h), wo, bo)
        t = F.layer_norm(xm, (h,), g2, b2, 1e-5)
        return xm + F.linear(F.gelu(F.linear(t, w1, bb1), approximate="tanh"), w2, bb2)
    tf = tb = 0.0
    for r in range(-2, reps):
        torch.cuda.synchronize(); t0 = time.perf_counter()
        y = block(x)
        torch.cuda.synchronize(); t1 = time.perf_counter()
        y.backward(dy)
        torch.cuda.synchronize(); t2 = time.perf_counter()
        if r >= 0:
            tf += t1 - t0; tb += t2 - t1
    tf, tb = tf / reps * 1e3, tb / reps * 1e3
    ff = n * (8 * s * h * h + 4 * s * s * h + 4 * s * h * f)
    fb = 2 * ff
    tfl = (ff + fb) / ((tf + tb) * 1e-3) / 1e12
    print(f"transformer\th{h} a{a} f{f} s{s}{' causal' if causal else ''}\t{n}\t{tf:.4f}\t{tb:.4f}"
          f"\t{ff / (tf * 1e-3) / 1e12:.1f}\t{fb / (tb * 1e-3) / 1e12:.1f}\t{tfl:.1f}\t{tfl / 989:.3f}",
          flush=True)

print("op\tshape\tbatch\tfwd_ms\tbwd_ms\tfwd_tflops\tbwd_tflops\ttflops\tmfu")
args = sys.argv[1:]
for i in range(0, len(args), 6):
    h, a, f, s, c = (int(v) for v in args[i:i + 5])
    for n in args[i + 5].split(","):
        bench(h, a, f, s, c, int(n))
        torch.cuda.empty_cache()
