"""Synthetic allocation traces in the format of ../shared/traces/README.md, for the workloads the
shared traces lack: generation with a key/value cache grown by concatenation (kv_growth, and
kv_growth_small's four small decoders on heaps under 64 MiB; decoder_requests' six decoders
serving requests, each a prefill and then tokens, with every layer's temporaries), inference with
changing batch sizes (infer_batches), training with a variable sequence length (varlen_train).
Deterministic (seeded). Usage: python3 gen_traces.py OUT_DIR (writes *.trace.gz).
python3 gen_traces.py OUT_DIR --seeds FIRST-LAST writes each workload at each of those seeds
instead (NAME_sSEED.trace.gz): the same program with other random choices (prompt lengths, batch
sizes, sequence lengths), to see how far a figure holds beyond the one seed the replay keeps.
The first line holds {"synthetic": true, "peak_live": ...}: no PyTorch figures for these."""
import gzip, json, random, sys
class T:
    def __init__(s,name): s.name=name; s.ev=[]; s.n=0; s.live={}; s.cur=0; s.peak=0
    def a(s,b,stream=0):
        s.n+=1; s.ev.append('a %d %d %d'%(s.n,b,stream)); s.live[s.n]=b; s.cur+=b; s.peak=max(s.peak,s.cur); return s.n
    def f(s,i): s.ev.append('f %d'%i); s.cur-=s.live.pop(i)
    def write(s,path,meta):
        for i in list(s.live): s.f(i)
        meta.update(name=s.name, synthetic=True, peak_live=s.peak)
        with gzip.open(path,'wt') as o:
            o.write('# '+json.dumps(meta)+'\n'); o.write('\n'.join(s.ev)+'\n')

def decode(name, seed, L, hid, B, heads, vocab, prompts, gen):
    """A decoder of L layers (hidden size hid, batch B, fp16) generating gen tokens after each of
    two prompts drawn from prompts, its key/value cache grown by concatenation: every token
    allocates each layer's key and value one token longer and frees the old ones."""
    r=random.Random(seed); t=T(name)
    bpe=2; c=B*hid*bpe
    w=[t.a(hid*hid*4*bpe) for _ in range(L*4)]  # weights
    for req in range(2):
        prompt=r.randint(*prompts)
        K=[t.a(prompt*c) for _ in range(L)]; V=[t.a(prompt*c) for _ in range(L)]
        for step in range(gen):
            n=prompt+step+1
            x=t.a(B*hid*bpe)
            for l in range(L):
                k=t.a(n*c); t.f(K[l]); K[l]=k
                v=t.a(n*c); t.f(V[l]); V[l]=v
                att=t.a(B*heads*n*4); h=t.a(B*hid*4*bpe); t.f(att); t.f(h)
            lo=t.a(B*vocab*4); t.f(lo); t.f(x)
        for i in K+V: t.f(i)
    return t

def kv_growth(seed=1):
    return decode('kv_growth', seed, L=12, hid=1024, B=8, heads=16, vocab=50257, prompts=(256,512), gen=256)

def kv_growth_small(seed=4):
    """Four small decoders (layers, hidden size, batch, tokens) on heaps of 11-35 MiB, the pool's
    small-heap goal: one trace each."""
    return [decode('kv_growth_small_%dx%d_b%d'%(L,hid,B), seed, L, hid, B, heads=4, vocab=5000,
                   prompts=(16,200), gen=gen)
            for L,hid,B,gen in [(4,256,4,128),(6,384,2,200),(2,512,8,100),(8,128,16,150)]]

def serve(name, seed, L, hid, B, heads, vocab, prompts, gen, requests=3):
    """A decoder of L layers (hidden size hid, fp16) serving requests, each of a batch drawn up to
    B and a prompt drawn from prompts: a prefill (every layer's norm, query, keys and values kept
    as the cache, scores and probabilities of prompt x prompt, context, output, residual, a 4x MLP),
    then gen tokens, each growing every layer's cache by concatenation among the same temporaries
    at one row: the allocations of a transformers decoder's generate(), layer by layer."""
    r=random.Random(seed); t=T(name); bpe=2
    [t.a(hid*hid*3*bpe) for _ in range(L*4)]; t.a(vocab*hid*bpe)  # weights, embedding
    def layer(h, rows, K, V, l, n, c):
        """One layer over rows new rows of a batch, its cache n rows of c bytes after them."""
        ln=t.a(rows*hid*bpe); q=t.a(rows*hid*bpe)
        if K[l] is None:
            K[l]=t.a(n*c); V[l]=t.a(n*c); t.f(ln)
        else:
            kn=t.a(rows*hid*bpe); vn=t.a(rows*hid*bpe); t.f(ln)
            k=t.a(n*c); t.f(K[l]); t.f(kn); K[l]=k
            v=t.a(n*c); t.f(V[l]); t.f(vn); V[l]=v
        s=t.a(heads*rows*n*bpe); pr=t.a(heads*rows*n*bpe); t.f(s)
        ctx=t.a(rows*hid*bpe); t.f(pr); t.f(q)
        o=t.a(rows*hid*bpe); t.f(ctx); h2=t.a(rows*hid*bpe); t.f(o); t.f(h); h=h2
        u=t.a(rows*hid*4*bpe); a=t.a(rows*hid*4*bpe); t.f(u); d=t.a(rows*hid*bpe); t.f(a)
        h2=t.a(rows*hid*bpe); t.f(d); t.f(h)
        return h2
    for _ in range(requests):
        b=r.choice([x for x in (1,2,4,8,16) if x<=B]); n=r.randint(*prompts); c=b*hid*bpe
        K=[None]*L; V=[None]*L
        h=t.a(b*n*hid*bpe)
        for l in range(L): h=layer(h, b*n, K, V, l, n, c)
        lo=t.a(b*vocab*4); t.f(lo); t.f(h)
        for _ in range(gen):
            n+=1; h=t.a(b*hid*bpe)
            for l in range(L): h=layer(h, b, K, V, l, n, c)
            lo=t.a(b*vocab*4); pr=t.a(b*vocab*4); t.f(lo); t.f(pr); t.f(h)
        for i in K+V: t.f(i)
    return t

def decoder_requests(seed=5):
    """Six decoders serving three requests each (layers, hidden size, largest batch, heads,
    vocabulary, prompt lengths, tokens), heaps of 8-240 MiB: one trace each."""
    return [serve('decoder_requests_%dx%d_b%d'%(L,hid,B), seed, L, hid, B, heads, vocab, prompts, gen)
            for L,hid,B,heads,vocab,prompts,gen in [
                (2,256,4,8,8000,(8,64),64), (4,384,2,6,8000,(16,128),96),
                (6,512,1,8,16000,(32,256),128), (3,768,2,12,30000,(16,96),80),
                (12,768,1,12,50257,(8,48),48), (2,1024,8,16,32000,(64,200),60)]]

def infer_batches(seed=2):
    r=random.Random(seed); t=T('infer_batches')
    w=[t.a(r.choice([2,4,8,16])*2**20) for _ in range(100)]
    layers=[r.choice([1,2,4])*2**20//8 for _ in range(50)]  # per-sample activation bytes
    for it in range(60):
        B=r.choice([1,2,4,8,16,24,32,48,64])
        prev=t.a(B*3*224*224*4)
        for l in layers:
            ws=t.a(r.choice([0,1])*2**20+512) if r.random()<0.3 else None
            y=t.a(B*l); t.f(prev); prev=y
            if ws: t.f(ws)
        t.f(prev)
    return t

def varlen_train(seed=3):
    r=random.Random(seed); t=T('varlen_train')
    L=12; hid=768; B=8; bpe=2
    params=[t.a(hid*hid*4*4) for _ in range(L*4)]
    adam=[t.a(hid*hid*4*4*2) for _ in range(L*4)]
    for step in range(20):
        S=r.choice([128,192,256,384,512,640,768,1024])
        tok=B*S
        saved=[]
        for l in range(L):
            for k in [1,1,4,4,1,1]:
                saved.append(t.a(tok*hid*k*bpe))
            tmp=t.a(tok*hid*bpe*3); t.f(tmp)
            att=t.a(B*12*S*S*bpe); saved.append(att)
        lo=t.a(tok*50257*4); lo2=t.a(tok*50257*4); t.f(lo)
        grads=[]
        t.f(lo2)
        for l in reversed(range(L)):
            g=t.a(tok*hid*bpe*4)
            for _ in range(7): t.f(saved.pop())
            gw=[t.a(hid*hid*4*4) for _ in range(4)]; grads+=gw
            t.f(g)
        for g in grads: t.f(g)
    return t

def seed_range(arg):
    """'FIRST-LAST' (inclusive) as a range, or None when it is not one."""
    lo,_,hi=arg.partition('-')
    if not (lo.isdigit() and hi.isdigit()) or int(lo)>int(hi): return None
    return range(int(lo),int(hi)+1)

if __name__=='__main__':
    # An option-looking or missing argument is a request for usage, never an output folder's name.
    args=sys.argv[1:]
    seeds=None
    if len(args)==3 and args[1]=='--seeds':
        seeds=seed_range(args[2])
        if seeds is None:
            print('gen_traces: --seeds takes FIRST-LAST (two numbers, FIRST <= LAST), not %r'%args[2]); sys.exit(2)
        args=args[:1]
    if len(args)!=1 or args[0].startswith('-'):
        print(__doc__); sys.exit(0 if args in (['-h'],['--help']) else 2)
    out=args[0]
    import os; os.makedirs(out, exist_ok=True)
    for fn in [kv_growth, kv_growth_small, decoder_requests, infer_batches, varlen_train]:
        for seed in (seeds or [None]):
            made=fn() if seed is None else fn(seed)
            for t in (made if isinstance(made,list) else [made]):
                if seed is not None: t.name='%s_s%d'%(t.name,seed)
                t.write('%s/%s.trace.gz'%(out,t.name),{})
                print(t.name,len(t.ev),'events, peak live %.1f MiB'%(t.peak/2**20))
