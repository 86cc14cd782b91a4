"""Decoding one token over a GQA cache ([1, 32 heads, 1, 128] queries, 8 key/value heads of [S, 128] bf16
keys and values), the flash op alone on THREADS threads: `python attention_decode_threads.py S1,S2,.. THREADS`;
the 10th percentile of 400 calls and the bytes/s of the cache read."""
import math, sys, time, torch
from transformer_engine.pytorch.custom_ops.attention import flash_attention
torch.set_num_threads(int(sys.argv[2]))
b,h,g,d=1,32,8,128
for s in [int(x) for x in sys.argv[1].split(',')]:
    q=torch.randn(b,h,1,d,dtype=torch.bfloat16)
    k,v=(torch.randn(b,g,s,d,dtype=torch.bfloat16) for _ in range(2))
    t=[]
    with torch.no_grad():
        for _ in range(400):
            a=time.perf_counter(); flash_attention(q,k,v,1/math.sqrt(d),(-1,0),True); t.append(time.perf_counter()-a)
    ms=sorted(t)[len(t)//10]*1e3
    print(f"threads {sys.argv[2]} S={s}: {ms:.3f} ms, {k.numel()*4/ms/1e6:.1f} GB/s")
