"""Right answers to notebook 09, written independently of the course (an audit of the checks): the source of
each, as a learner would type it in the notebook (torch, math and F in scope). Every one must pass its check."""

# (exercise, what it does differently, source)
RIGHT = [
    ('online_softmax', 'os chunk (torch.chunk, n blocks = ceil)', '''def online_softmax(x, block_size=1):
    n = x.shape[-1]
    m = torch.full((*x.shape[:-1], 1), float("-inf"), dtype=x.dtype)
    l = torch.zeros_like(m)
    nblocks = (n + block_size - 1) // block_size
    for blk in torch.chunk(x, nblocks, dim=-1):
        bm = torch.max(blk, dim=-1, keepdim=True).values
        m_new = torch.maximum(m, bm)
        l = l * torch.exp(m - m_new) + torch.sum(torch.exp(blk - m_new), dim=-1, keepdim=True)
        m = m_new
    return torch.exp(x - m) / l
'''),
    ('online_softmax', 'os unfold after F.pad -inf', '''def online_softmax(x, block_size=1):
    n = x.shape[-1]
    pad = (-n) % block_size
    xp = F.pad(x, (0, pad), value=-math.inf)
    blocks = xp.unfold(-1, block_size, block_size)   # (..., nb, b)
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    l = torch.zeros_like(m)
    for i in range(blocks.shape[-2]):
        blk = blocks[..., i, :]
        m_new = torch.maximum(m, blk.amax(-1, keepdim=True))
        l = l * torch.exp(m - m_new) + torch.exp(blk - m_new).sum(-1, keepdim=True)
        m = m_new
    return torch.exp(x - m) / l
'''),
    ('online_softmax', 'os F.pad + reshape into (..., nb, b)', '''def online_softmax(x, block_size=1):
    n = x.shape[-1]
    nb = -(-n // block_size)
    xp = F.pad(x, (0, nb * block_size - n), value=float("-inf")).reshape(*x.shape[:-1], nb, block_size)
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    l = torch.zeros(x.shape[:-1] + (1,), dtype=x.dtype)
    for j in range(nb):
        b = xp[..., j, :]
        mb = b.max(-1, keepdim=True)[0]
        mn = torch.maximum(m, mb)
        l = l * (m - mn).exp() + (b - mn).exp().sum(-1, keepdim=True)
        m = mn
    return (x - m).exp() / l
'''),
    ('online_softmax', 'os while loop', '''def online_softmax(x, block_size=1):
    n = x.size(-1)
    m = x.new_full(x.shape[:-1] + (1,), -math.inf)
    l = x.new_zeros(x.shape[:-1] + (1,))
    start = 0
    while start < n:
        end = min(start + block_size, n)
        blk = x[..., start:end]
        m_blk = blk.amax(dim=-1, keepdim=True)
        m_new = torch.where(m > m_blk, m, m_blk)
        l = l * torch.exp(m - m_new) + torch.exp(blk - m_new).sum(dim=-1, keepdim=True)
        m = m_new
        start = end
    return torch.exp(x - m) / l
'''),
    ('online_softmax', 'os rows in chunks of 2 rows', '''def online_softmax(x, block_size=1):
    shape, n = x.shape, x.shape[-1]
    x2 = x.reshape(-1, n)
    out = torch.empty_like(x2)
    for r in range(0, x2.shape[0], 2):
        rows = x2[r:r + 2]
        m = torch.full((rows.shape[0], 1), -math.inf, dtype=x.dtype)
        l = torch.zeros_like(m)
        for s in range(0, n, block_size):
            blk = rows[:, s:s + block_size]
            m_new = torch.maximum(m, blk.amax(1, keepdim=True))
            l = l * torch.exp(m - m_new) + torch.exp(blk - m_new).sum(1, keepdim=True)
            m = m_new
        out[r:r + 2] = torch.exp(rows - m) / l
    return out.reshape(shape)
'''),
    ('online_softmax', 'os Tensor.max(dim)[0] no keepdim, unsqueeze', '''def online_softmax(x, block_size=1):
    m = torch.full(x.shape[:-1], -math.inf, dtype=x.dtype)
    l = torch.zeros(x.shape[:-1], dtype=x.dtype)
    for s in range(0, x.shape[-1], block_size):
        blk = x[..., s:s + block_size]
        bmax, _ = blk.max(dim=-1)
        new_m = torch.max(m, bmax)
        l = l * torch.exp(m - new_m) + torch.exp(blk - new_m.unsqueeze(-1)).sum(dim=-1)
        m = new_m
    return torch.exp(x - m.unsqueeze(-1)) / l.unsqueeze(-1)
'''),
    ('online_softmax', 'os logaddexp running lse, amax+sum inside', '''def online_softmax(x, block_size=1):
    lse = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    for s in range(0, x.shape[-1], block_size):
        blk = x[..., s:s + block_size]
        bm = blk.amax(-1, keepdim=True)
        blse = bm + torch.log(torch.exp(blk - bm).sum(-1, keepdim=True))
        lse = torch.logaddexp(lse, blse)
    return torch.exp(x - lse)
'''),
    ('online_softmax', 'os float64 state, converted back', '''def online_softmax(x, block_size=1):
    xd = x.to(torch.float64)
    m = torch.full(xd.shape[:-1] + (1,), -math.inf, dtype=torch.float64)
    l = torch.zeros_like(m)
    for s in range(0, xd.shape[-1], block_size):
        b = xd[..., s:s + block_size]
        mn = torch.maximum(m, b.amax(-1, keepdim=True))
        l = l * torch.exp(m - mn) + torch.exp(b - mn).sum(-1, keepdim=True)
        m = mn
    return (torch.exp(xd - m) / l).to(x.dtype)
'''),
    ('online_softmax', 'os in-place mul_/add_/copy_', '''def online_softmax(x, block_size=1):
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    l = torch.zeros_like(m)
    for s in range(0, x.shape[-1], block_size):
        blk = x[..., s:s + block_size]
        m_new = torch.maximum(m, blk.amax(-1, keepdim=True))
        l.mul_(torch.exp(m - m_new)).add_(torch.exp(blk - m_new).sum(-1, keepdim=True))
        m.copy_(m_new)
    out = x - m
    out.exp_()
    out.div_(l)
    return out
'''),
    ('online_softmax', 'os block max computed twice (after the sum)', '''def online_softmax(x, block_size=1):
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    l = torch.zeros_like(m)
    for s in range(0, x.shape[-1], block_size):
        blk = x[..., s:s + block_size]
        m_new = torch.maximum(m, blk.amax(-1, keepdim=True))
        l = l * torch.exp(m - m_new) + torch.exp(blk - m_new).sum(-1, keepdim=True)
        m = torch.maximum(m, blk.amax(-1, keepdim=True))   # same thing, written again
    return torch.exp(x - m) / l
'''),
    ('online_softmax', 'os output block by block + cat', '''def online_softmax(x, block_size=1):
    n = x.shape[-1]
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    l = torch.zeros_like(m)
    for s in range(0, n, block_size):
        blk = x[..., s:s + block_size]
        m_new = torch.maximum(m, blk.amax(-1, keepdim=True))
        l = l * torch.exp(m - m_new) + torch.exp(blk - m_new).sum(-1, keepdim=True)
        m = m_new
    return torch.cat([torch.exp(x[..., s:s + block_size] - m) / l for s in range(0, n, block_size)], dim=-1)
'''),
    ('online_softmax', 'os torch.where for the first block', '''def online_softmax(x, block_size=1):
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    l = torch.zeros_like(m)
    for i, s in enumerate(range(0, x.shape[-1], block_size)):
        blk = x[..., s:s + block_size]
        bm = blk.amax(-1, keepdim=True)
        m_new = bm if i == 0 else torch.maximum(m, bm)
        scale = torch.where(torch.isinf(m), torch.zeros_like(m), torch.exp(m - m_new))
        l = l * scale + torch.exp(blk - m_new).sum(-1, keepdim=True)
        m = m_new
    return torch.exp(x - m) / l
'''),
    ('online_softmax', 'os 1-D via reshape(-1, n)', '''def online_softmax(x, block_size=1):
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    m = torch.full((x2.shape[0], 1), -math.inf, dtype=x.dtype)
    l = torch.zeros((x2.shape[0], 1), dtype=x.dtype)
    b = min(block_size, n)
    for s in range(0, n, b):
        blk = x2[:, s:s + b]
        mn = torch.maximum(m, torch.amax(blk, dim=1, keepdim=True))
        l = torch.exp(m - mn) * l + torch.exp(blk - mn).sum(dim=1, keepdim=True)
        m = mn
    return (torch.exp(x2 - m) / l).reshape(x.shape)
'''),
    ('online_softmax', 'os rows one by one, Python floats via .item()', '''def online_softmax(x, block_size=1):
    n = x.shape[-1]
    flat = x.reshape(-1, n)
    out = torch.empty_like(flat)
    for r in range(flat.shape[0]):
        row = flat[r]
        m, l = -math.inf, 0.0
        for s in range(0, n, block_size):
            blk = row[s:s + block_size]
            m_new = max(m, blk.max().item())
            l = l * math.exp(m - m_new) + torch.exp(blk - m_new).sum().item()
            m = m_new
        out[r] = torch.exp(row - m) / l
    return out.reshape(x.shape)
'''),
    ('online_softmax', 'os m starts at x[..., :1] (no -inf)', '''def online_softmax(x, block_size=1):
    m = x[..., :1].clone()
    l = torch.zeros_like(m)
    for s in range(0, x.shape[-1], block_size):
        blk = x[..., s:s + block_size]
        m_new = torch.maximum(m, blk.amax(-1, keepdim=True))
        l = l * torch.exp(m - m_new) + torch.exp(blk - m_new).sum(-1, keepdim=True)
        m = m_new
    return torch.exp(x - m) / l
'''),
    ('online_softmax', 'os narrow + functional torch.sum(torch.exp(torch.sub()))', '''def online_softmax(x, block_size=1):
    n = x.shape[-1]
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    l = torch.zeros_like(m)
    for s in range(0, n, block_size):
        blk = torch.narrow(x, -1, s, min(block_size, n - s))
        m_new = torch.maximum(m, torch.amax(blk, -1, keepdim=True))
        l = torch.add(torch.mul(l, torch.exp(torch.sub(m, m_new))),
                      torch.sum(torch.exp(torch.sub(blk, m_new)), -1, keepdim=True))
        m = m_new
    return torch.div(torch.exp(torch.sub(x, m)), l)
'''),
    ('online_softmax', 'os index_select per block', '''def online_softmax(x, block_size=1):
    n = x.shape[-1]
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    l = torch.zeros_like(m)
    for s in range(0, n, block_size):
        idx = torch.arange(s, min(s + block_size, n))
        blk = x.index_select(-1, idx)
        m_new = torch.maximum(m, blk.amax(-1, keepdim=True))
        l = l * torch.exp(m - m_new) + torch.exp(blk - m_new).sum(-1, keepdim=True)
        m = m_new
    return torch.exp(x - m) / l
'''),
    ('online_softmax', 'os movedim, blocks on axis 0', '''def online_softmax(x, block_size=1):
    xt = x.movedim(-1, 0)                  # (n, ...)
    m = torch.full(xt.shape[1:], -math.inf, dtype=x.dtype)
    l = torch.zeros_like(m)
    for s in range(0, xt.shape[0], block_size):
        blk = xt[s:s + block_size]
        m_new = torch.maximum(m, blk.amax(0))
        l = l * torch.exp(m - m_new) + torch.exp(blk - m_new).sum(0)
        m = m_new
    return (torch.exp(xt - m) / l).movedim(0, -1)
'''),
    ('online_softmax', 'os clone each block, exp once, reuse for sum', '''def online_softmax(x, block_size=1):
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    l = torch.zeros_like(m)
    for s in range(0, x.shape[-1], block_size):
        blk = x[..., s:s + block_size].clone()
        m_new = torch.maximum(m, blk.amax(-1, keepdim=True))
        e = torch.exp(blk - m_new)
        l = l * torch.exp(m - m_new) + e.sum(-1, keepdim=True)
        m = m_new
        del blk, e
    return torch.exp(x - m) / l
'''),
    ('tiled_attention', 'ta list of output blocks + cat, enumerate(range)', '''def tiled_attention(q, k, v, block_size=64):
    n_q, n_k, d_k = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = d_k ** -0.5
    outs = []
    for qi, qs in enumerate(range(0, n_q, block_size)):
        qb = q[..., qs:qs + block_size, :]
        m = torch.full((*qb.shape[:-1], 1), -math.inf, dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros((*qb.shape[:-1], v.shape[-1]), dtype=q.dtype)
        for kj, ks in enumerate(range(0, n_k, block_size)):
            kb, vb = k[..., ks:ks + block_size, :], v[..., ks:ks + block_size, :]
            s = torch.matmul(qb, kb.mT) * scale
            m_new = torch.maximum(m, s.max(dim=-1, keepdim=True).values)
            c = torch.exp(m - m_new)
            p = torch.exp(s - m_new)
            l = c * l + p.sum(-1, keepdim=True)
            acc = c * acc + torch.matmul(p, vb)
            m = m_new
        outs.append(acc / l)
    return torch.cat(outs, dim=-2)
'''),
    ('tiled_attention', 'ta einsum both products', '''def tiled_attention(q, k, v, block_size=64):
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1])
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    for i in range(0, n_q, block_size):
        qi = q[..., i:i + block_size, :]
        m = torch.full(qi.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(qi.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for j in range(0, n_k, block_size):
            s = torch.einsum("...qd,...kd->...qk", qi, k[..., j:j + block_size, :]) * scale
            mn = torch.maximum(m, s.amax(-1, keepdim=True))
            p = torch.exp(s - mn)
            corr = torch.exp(m - mn)
            l = l * corr + p.sum(-1, keepdim=True)
            acc = acc * corr + torch.einsum("...qk,...kd->...qd", p, v[..., j:j + block_size, :])
            m = mn
        out[..., i:i + block_size, :] = acc / l
    return out
'''),
    ('tiled_attention', 'ta bmm on reshaped batches', '''def tiled_attention(q, k, v, block_size=64):
    lead = q.shape[:-2]
    n_q, d_k = q.shape[-2:]
    n_k, d_v = v.shape[-2:]
    q3, k3, v3 = q.reshape(-1, n_q, d_k), k.reshape(-1, n_k, d_k), v.reshape(-1, n_k, d_v)
    B = q3.shape[0]
    out = torch.empty(B, n_q, d_v, dtype=q.dtype)
    scale = 1.0 / math.sqrt(d_k)
    for qs in range(0, n_q, block_size):
        qb = q3[:, qs:qs + block_size] * scale
        m = torch.full((B, qb.shape[1], 1), -math.inf, dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(B, qb.shape[1], d_v, dtype=q.dtype)
        for ks in range(0, n_k, block_size):
            s = torch.bmm(qb, k3[:, ks:ks + block_size].transpose(1, 2))
            m2 = torch.maximum(m, s.amax(2, keepdim=True))
            p = torch.exp(s - m2)
            a = torch.exp(m - m2)
            l = l * a + p.sum(2, keepdim=True)
            acc = torch.baddbmm(acc * a, p, v3[:, ks:ks + block_size])
            m = m2
        out[:, qs:qs + block_size] = acc / l
    return out.reshape(*lead, n_q, d_v)
'''),
    ('tiled_attention', 'ta exp2 with log2(e) folded into scale', '''def tiled_attention(q, k, v, block_size=64):
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = math.log2(math.e) / math.sqrt(q.shape[-1])
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n_q, block_size):
        qb = q[..., qs:qs + block_size, :]
        m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for ks in range(0, n_k, block_size):
            s = (qb @ k[..., ks:ks + block_size, :].transpose(-1, -2)) * scale
            mn = torch.maximum(m, s.amax(-1, keepdim=True))
            p = torch.exp2(s - mn)
            c = torch.exp2(m - mn)
            l = l * c + p.sum(-1, keepdim=True)
            acc = acc * c + p @ v[..., ks:ks + block_size, :]
            m = mn
        out[..., qs:qs + block_size, :] = acc / l
    return out
'''),
    ('tiled_attention', 'ta dict of query-block results', '''def tiled_attention(q, k, v, block_size=64):
    n_q, n_k = q.shape[-2], k.shape[-2]
    sc = q.shape[-1] ** -0.5
    results = {}
    for qs in range(0, n_q, block_size):
        qb = q[..., qs:qs + block_size, :]
        m = torch.full(qb.shape[:-1] + (1,), float("-inf"), dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(*qb.shape[:-1], v.shape[-1], dtype=q.dtype)
        for ks in range(0, n_k, block_size):
            s = qb @ k[..., ks:ks + block_size, :].transpose(-2, -1) * sc
            new_m = torch.max(m, s.amax(-1, keepdim=True))
            p = (s - new_m).exp()
            r = (m - new_m).exp()
            l = r * l + p.sum(-1, keepdim=True)
            acc = r * acc + p @ v[..., ks:ks + block_size, :]
            m = new_m
        results[qs] = acc / l
    return torch.cat([results[key] for key in sorted(results)], dim=-2)
'''),
    ('tiled_attention', 'ta float64 internal, converted back', '''def tiled_attention(q, k, v, block_size=64):
    dtype = q.dtype
    q, k, v = q.double(), k.double(), v.double()
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1])
    out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=torch.float64)
    for qs in range(0, n_q, block_size):
        qe = min(qs + block_size, n_q)
        qb = q[..., qs:qe, :]
        m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=torch.float64)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=torch.float64)
        for ks in range(0, n_k, block_size):
            ke = min(ks + block_size, n_k)
            s = qb @ k[..., ks:ke, :].transpose(-2, -1) * scale
            mn = torch.maximum(m, s.amax(-1, keepdim=True))
            p = torch.exp(s - mn)
            c = torch.exp(m - mn)
            l = l * c + p.sum(-1, keepdim=True)
            acc = acc * c + p @ v[..., ks:ke, :]
            m = mn
        out[..., qs:qe, :] = acc / l
    return out.to(dtype)
'''),
    ('tiled_attention', 'ta no_grad inside + del s, p', '''def tiled_attention(q, k, v, block_size=64):
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    with torch.no_grad():
        out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for qs in range(0, n_q, block_size):
            qb = q[..., qs:qs + block_size, :]
            m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
            l = torch.zeros_like(m)
            acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
            for ks in range(0, n_k, block_size):
                s = qb @ k[..., ks:ks + block_size, :].transpose(-2, -1) * scale
                m_new = torch.maximum(m, s.amax(-1, keepdim=True))
                p = torch.exp(s - m_new)
                alpha = torch.exp(m - m_new)
                l = l * alpha + p.sum(-1, keepdim=True)
                acc = acc * alpha + p @ v[..., ks:ks + block_size, :]
                m = m_new
                del s, p
            out[..., qs:qs + block_size, :] = acc / l
    return out
'''),
    ('tiled_attention', 'ta tiles in torch.empty filled by matmul(out=)', '''def tiled_attention(q, k, v, block_size=64):
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = q.shape[-1] ** -0.5
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n_q, block_size):
        qb = q[..., qs:qs + block_size, :]
        bq = qb.shape[-2]
        m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for ks in range(0, n_k, block_size):
            kb = k[..., ks:ks + block_size, :]
            s = torch.empty(*q.shape[:-2], bq, kb.shape[-2], dtype=q.dtype)
            torch.matmul(qb, kb.transpose(-2, -1), out=s)
            s.mul_(scale)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            s.sub_(m_new).exp_()
            corr = torch.exp(m - m_new)
            l = l * corr + s.sum(-1, keepdim=True)
            acc = acc * corr + s @ v[..., ks:ks + block_size, :]
            m = m_new
        out[..., qs:qs + block_size, :] = acc / l
    return out
'''),
    ('tiled_attention', 'ta l, m of shape (..., b), in-place state', '''def tiled_attention(q, k, v, block_size=64):
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1])
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n_q, block_size):
        qb = q[..., qs:qs + block_size, :]
        m = torch.full(qb.shape[:-1], -math.inf, dtype=q.dtype)        # (..., b)
        l = torch.zeros_like(m)                                          # (..., b)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for ks in range(0, n_k, block_size):
            s = qb @ k[..., ks:ks + block_size, :].transpose(-2, -1) * scale
            m_new = torch.maximum(m, s.amax(-1))
            p = torch.exp(s - m_new[..., None])
            c = torch.exp(m - m_new)
            l.mul_(c).add_(p.sum(-1))
            acc.mul_(c[..., None]).add_(p @ v[..., ks:ks + block_size, :])
            m.copy_(m_new)
        out[..., qs:qs + block_size, :] = acc / l[..., None]
    return out
'''),
    ('tiled_attention', 'ta q scaled once up front, torch.split + zip', '''def tiled_attention(q, k, v, block_size=64):
    q = q / math.sqrt(q.shape[-1])
    k_blocks = torch.split(k, block_size, dim=-2)
    v_blocks = torch.split(v, block_size, dim=-2)
    outs = []
    for qb in torch.split(q, block_size, dim=-2):
        m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for kb, vb in zip(k_blocks, v_blocks):
            s = qb @ kb.transpose(-2, -1)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            p = torch.exp(s - m_new)
            c = torch.exp(m - m_new)
            l = l * c + p.sum(-1, keepdim=True)
            acc = acc * c + p @ vb
            m = m_new
        outs.append(acc / l)
    return torch.cat(outs, -2)
'''),
    ('tiled_attention', 'ta while loops, first tile initialises state', '''def tiled_attention(q, k, v, block_size=64):
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1])
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    qs = 0
    while qs < n_q:
        qe = min(n_q, qs + block_size)
        qb = q[..., qs:qe, :]
        m = l = acc = None
        ks = 0
        while ks < n_k:
            ke = min(n_k, ks + block_size)
            s = qb @ k[..., ks:ke, :].transpose(-2, -1) * scale
            tile_max = s.amax(-1, keepdim=True)
            if m is None:
                m = tile_max
                p = torch.exp(s - m)
                l = p.sum(-1, keepdim=True)
                acc = p @ v[..., ks:ke, :]
            else:
                m_new = torch.maximum(m, tile_max)
                p = torch.exp(s - m_new)
                c = torch.exp(m - m_new)
                l = l * c + p.sum(-1, keepdim=True)
                acc = acc * c + p @ v[..., ks:ke, :]
                m = m_new
            ks = ke
        out[..., qs:qe, :] = acc / l
        qs = qe
    return out
'''),
    ('tiled_attention', 'ta matmul with k.transpose precomputed contiguous', '''def tiled_attention(q, k, v, block_size=64):
    kT = k.transpose(-2, -1).contiguous()        # (..., d_k, n_k)
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1])
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n_q, block_size):
        qb = q[..., qs:qs + block_size, :]
        m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for ks in range(0, n_k, block_size):
            s = torch.matmul(qb, kT[..., :, ks:ks + block_size]) * scale
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            p = torch.exp(s - m_new)
            c = torch.exp(m - m_new)
            l = l * c + p.sum(-1, keepdim=True)
            acc = acc * c + torch.matmul(p, v[..., ks:ks + block_size, :])
            m = m_new
        out[..., qs:qs + block_size, :] = acc / l
    return out
'''),
    ('tiled_attention', 'ta running lse with logaddexp, normalised acc', '''def tiled_attention(q, k, v, block_size=64):
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1])
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n_q, block_size):
        qb = q[..., qs:qs + block_size, :]
        lse = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        o = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for ks in range(0, n_k, block_size):
            s = qb @ k[..., ks:ks + block_size, :].transpose(-2, -1) * scale
            tile_lse = torch.logsumexp(s, -1, keepdim=True)
            new = torch.logaddexp(lse, tile_lse)
            o = o * torch.exp(lse - new) + torch.exp(s - new) @ v[..., ks:ks + block_size, :]
            lse = new
        out[..., qs:qs + block_size, :] = o
    return out
'''),
    ('causal_tiled_attention', 'ca early break + torch.where mask', '''def causal_tiled_attention(q, k, v, block_size=64):
    n = q.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1])
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n, block_size):
        qe = min(qs + block_size, n)
        qb = q[..., qs:qe, :]
        m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for ks in range(0, n, block_size):
            if ks >= qe:
                break
            ke = min(ks + block_size, n)
            s = qb @ k[..., ks:ke, :].transpose(-2, -1) * scale
            qpos = torch.arange(qs, qe).unsqueeze(1)
            kpos = torch.arange(ks, ke).unsqueeze(0)
            s = torch.where(kpos <= qpos, s, torch.tensor(-math.inf, dtype=q.dtype))
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            p = torch.exp(s - m_new)
            c = torch.exp(m - m_new)
            l = l * c + p.sum(-1, keepdim=True)
            acc = acc * c + p @ v[..., ks:ke, :]
            m = m_new
        out[..., qs:qe, :] = acc / l
    return out
'''),
    ('causal_tiled_attention', 'ca -inf bias tile per tile, list + cat', '''def causal_tiled_attention(q, k, v, block_size=64):
    n = q.shape[-2]
    scale = q.shape[-1] ** -0.5
    outs = []
    for qs in range(0, n, block_size):
        qe = min(qs + block_size, n)
        qb = q[..., qs:qe, :]
        m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for ks in range(0, qe, block_size):
            ke = min(ks + block_size, n)
            rows = torch.arange(qs, qe)[:, None]
            cols = torch.arange(ks, ke)[None, :]
            bias = torch.zeros(qe - qs, ke - ks, dtype=q.dtype).masked_fill(cols > rows, float("-inf"))
            s = qb @ k[..., ks:ke, :].mT * scale + bias
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            p = torch.exp(s - m_new)
            c = torch.exp(m - m_new)
            l = l * c + p.sum(-1, keepdim=True)
            acc = acc * c + p @ v[..., ks:ke, :]
            m = m_new
        outs.append(acc / l)
    return torch.cat(outs, dim=-2)
'''),
    ('causal_tiled_attention', 'ca mask only the diagonal tile, masked_fill_ in place', '''def causal_tiled_attention(q, k, v, block_size=64):
    n = q.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1])
    out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n, block_size):
        qe = min(qs + block_size, n)
        qb = q[..., qs:qe, :]
        m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for ks in range(0, qe, block_size):
            ke = min(ks + block_size, n)
            s = qb @ k[..., ks:ke, :].transpose(-2, -1) * scale
            if ke - 1 > qs:                      # this tile reaches above the diagonal
                mask = torch.arange(ks, ke)[None, :] > torch.arange(qs, qe)[:, None]
                s.masked_fill_(mask, -math.inf)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            p = torch.exp(s - m_new)
            c = torch.exp(m - m_new)
            l = l * c + p.sum(-1, keepdim=True)
            acc = acc * c + p @ v[..., ks:ke, :]
            m = m_new
        out[..., qs:qe, :] = acc / l
    return out
'''),
    ('causal_tiled_attention', 'ca triu per tile with offset, exp2', '''def causal_tiled_attention(q, k, v, block_size=64):
    n = q.shape[-2]
    scale = math.log2(math.e) / math.sqrt(q.shape[-1])
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n, block_size):
        qe = min(qs + block_size, n)
        qb = q[..., qs:qe, :]
        m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for ks in range(0, qe, block_size):
            ke = min(ks + block_size, n)
            s = (qb @ k[..., ks:ke, :].transpose(-2, -1)) * scale
            future = torch.ones(qe - qs, ke - ks, dtype=torch.bool).triu(qs - ks + 1)
            s = s.masked_fill(future, -math.inf)
            mn = torch.maximum(m, s.amax(-1, keepdim=True))
            p = torch.exp2(s - mn)
            c = torch.exp2(m - mn)
            l = l * c + p.sum(-1, keepdim=True)
            acc = acc * c + p @ v[..., ks:ke, :]
            m = mn
        out[..., qs:qe, :] = acc / l
    return out
'''),
    ('causal_tiled_attention', 'ca float64 inside, l and m (..., b), dict of results', '''def causal_tiled_attention(q, k, v, block_size=64):
    dt = q.dtype
    q, k, v = q.double(), k.double(), v.double()
    n = q.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1])
    res = {}
    for qs in range(0, n, block_size):
        qe = min(qs + block_size, n)
        qb = q[..., qs:qe, :]
        m = torch.full(qb.shape[:-1], -math.inf, dtype=torch.float64)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=torch.float64)
        for ks in range(0, qe, block_size):
            ke = min(ks + block_size, n)
            s = qb @ k[..., ks:ke, :].transpose(-2, -1) * scale
            s = s.masked_fill(torch.arange(ks, ke) > torch.arange(qs, qe)[:, None], -math.inf)
            mn = torch.maximum(m, s.amax(-1))
            p = torch.exp(s - mn[..., None])
            c = torch.exp(m - mn)
            l = l * c + p.sum(-1)
            acc = acc * c[..., None] + p @ v[..., ks:ke, :]
            m = mn
        res[qs] = (acc / l[..., None]).to(dt)
    return torch.cat([res[i] for i in sorted(res)], -2)
'''),
    ('causal_tiled_attention', 'ca einsum, enumerate key blocks up to diagonal', '''def causal_tiled_attention(q, k, v, block_size=64):
    n, d = q.shape[-2], q.shape[-1]
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    nb = (n + block_size - 1) // block_size
    for i in range(nb):
        qs, qe = i * block_size, min((i + 1) * block_size, n)
        qb = q[..., qs:qe, :] / math.sqrt(d)
        m = torch.full((*qb.shape[:-1], 1), -math.inf, dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(*qb.shape[:-1], v.shape[-1], dtype=q.dtype)
        for j in range(i + 1):
            ks, ke = j * block_size, min((j + 1) * block_size, n)
            s = torch.einsum("...id,...jd->...ij", qb, k[..., ks:ke, :])
            if j == i:
                s = s.masked_fill(torch.arange(ks, ke)[None] > torch.arange(qs, qe)[:, None], -math.inf)
            mn = torch.maximum(m, s.amax(-1, keepdim=True))
            p = (s - mn).exp()
            c = (m - mn).exp()
            l = l * c + p.sum(-1, keepdim=True)
            acc = acc * c + torch.einsum("...ij,...jd->...id", p, v[..., ks:ke, :])
            m = mn
        out[..., qs:qe, :] = acc / l
    return out
'''),
    ('causal_tiled_attention', 'ca bmm on reshaped batches, no_grad, del', '''def causal_tiled_attention(q, k, v, block_size=64):
    lead, (n, d_k), d_v = q.shape[:-2], q.shape[-2:], v.shape[-1]
    q3, k3, v3 = q.reshape(-1, n, d_k), k.reshape(-1, n, d_k), v.reshape(-1, n, d_v)
    B, scale = q3.shape[0], 1 / math.sqrt(d_k)
    out = torch.empty(B, n, d_v, dtype=q.dtype)
    with torch.no_grad():
        for qs in range(0, n, block_size):
            qe = min(n, qs + block_size)
            qb = q3[:, qs:qe]
            m = torch.full((B, qe - qs, 1), -math.inf, dtype=q.dtype)
            l = torch.zeros_like(m)
            acc = torch.zeros(B, qe - qs, d_v, dtype=q.dtype)
            for ks in range(0, qe, block_size):
                ke = min(n, ks + block_size)
                s = torch.bmm(qb, k3[:, ks:ke].transpose(1, 2)) * scale
                s[:, torch.arange(ks, ke)[None, :] > torch.arange(qs, qe)[:, None]] = -math.inf
                mn = torch.maximum(m, s.amax(-1, keepdim=True))
                p = torch.exp(s - mn)
                c = torch.exp(m - mn)
                l = l * c + p.sum(-1, keepdim=True)
                acc = acc * c + torch.bmm(p, v3[:, ks:ke])
                m = mn
                del s, p
            out[:, qs:qe] = acc / l
    return out.reshape(*lead, n, d_v)
'''),
    ('causal_tiled_attention', 'ca tile trimmed to keys <= last query, -1e30 fill', '''def causal_tiled_attention(q, k, v, block_size=64):
    n = q.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1])
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n, block_size):
        qe = min(qs + block_size, n)
        qb = q[..., qs:qe, :]
        m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        ks = 0
        while ks < qe:
            ke = min(ks + block_size, qe)
            s = qb @ k[..., ks:ke, :].transpose(-2, -1) * scale
            if ke > qs + 1:
                pos_q = torch.arange(qs, qe).view(-1, 1)
                pos_k = torch.arange(ks, ke).view(1, -1)
                s = s.masked_fill(pos_k > pos_q, -1e30 if q.dtype == torch.float64 else -1e30)
            mn = torch.maximum(m, s.amax(-1, keepdim=True))
            p = torch.exp(s - mn)
            c = torch.exp(m - mn)
            l = l * c + p.sum(-1, keepdim=True)
            acc = acc * c + p @ v[..., ks:ke, :]
            m = mn
            ks = ke
        out[..., qs:qe, :] = acc / l
    return out
'''),
    ('causal_tiled_attention', 'ca torch.split blocks, zip with index', '''def causal_tiled_attention(q, k, v, block_size=64):
    scale = 1 / math.sqrt(q.shape[-1])
    qbs = torch.split(q, block_size, -2)
    kbs = torch.split(k, block_size, -2)
    vbs = torch.split(v, block_size, -2)
    outs = []
    for i, qb in enumerate(qbs):
        qs = i * block_size
        m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for j, (kb, vb) in enumerate(zip(kbs[:i + 1], vbs[:i + 1])):
            ks = j * block_size
            s = qb @ kb.transpose(-2, -1) * scale
            hide = (torch.arange(kb.shape[-2]) + ks)[None, :] > (torch.arange(qb.shape[-2]) + qs)[:, None]
            s = s.masked_fill(hide, -math.inf)
            mn = torch.maximum(m, s.amax(-1, keepdim=True))
            p = torch.exp(s - mn)
            c = torch.exp(m - mn)
            l = l * c + p.sum(-1, keepdim=True)
            acc = acc * c + p @ vb
            m = mn
        outs.append(acc / l)
    return torch.cat(outs, -2)
'''),
    ('causal_tiled_attention', 'ca logsumexp running state + torch.where', '''def causal_tiled_attention(q, k, v, block_size=64):
    n = q.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1])
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n, block_size):
        qe = min(qs + block_size, n)
        qb = q[..., qs:qe, :]
        lse = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        o = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for ks in range(0, qe, block_size):
            ke = min(ks + block_size, n)
            s = qb @ k[..., ks:ke, :].transpose(-2, -1) * scale
            ok = torch.arange(ks, ke)[None, :] <= torch.arange(qs, qe)[:, None]
            s = torch.where(ok, s, -math.inf)
            new = torch.logaddexp(lse, torch.logsumexp(s, -1, keepdim=True))
            o = o * torch.exp(lse - new) + torch.exp(s - new) @ v[..., ks:ke, :]
            lse = new
        out[..., qs:qe, :] = o
    return out
'''),
    ('online_softmax', 'os recursion over leading axes (torch.stack of rows)', '''def online_softmax(x, block_size=1):
    if x.dim() > 1:
        return torch.stack([online_softmax(r, block_size) for r in x])
    m, l = x.new_tensor(-math.inf), x.new_tensor(0.0)
    for s in range(0, x.numel(), block_size):
        blk = x[s:s + block_size]
        m_new = torch.maximum(m, blk.max())
        l = l * torch.exp(m - m_new) + torch.exp(blk - m_new).sum()
        m = m_new
    return torch.exp(x - m) / l
'''),
    ('online_softmax', 'os exp tiles of each block kept (shifted by own max), reused at the end', '''def online_softmax(x, block_size=1):
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    l = torch.zeros_like(m)
    parts = []
    for s in range(0, x.shape[-1], block_size):
        blk = x[..., s:s + block_size]
        bm = blk.amax(-1, keepdim=True)
        e = torch.exp(blk - bm)
        parts.append((e, bm))
        m_new = torch.maximum(m, bm)
        l = l * torch.exp(m - m_new) + e.sum(-1, keepdim=True) * torch.exp(bm - m_new)
        m = m_new
    return torch.cat([e * torch.exp(bm - m) for e, bm in parts], -1) / l
'''),
    ('online_softmax', 'os running max via torch.stack([m, bm]).amax(0)', '''def online_softmax(x, block_size=1):
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    l = torch.zeros_like(m)
    for s in range(0, x.shape[-1], block_size):
        blk = x[..., s:s + block_size]
        m_new = torch.stack([m, blk.amax(-1, keepdim=True)]).amax(0)
        l = torch.stack([l * torch.exp(m - m_new), torch.exp(blk - m_new).sum(-1, keepdim=True)]).sum(0)
        m = m_new
    return torch.exp(x - m) / l
'''),
    ('online_softmax', 'os sums via @ ones inside the one loop', '''def online_softmax(x, block_size=1):
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    l = torch.zeros_like(m)
    for s in range(0, x.shape[-1], block_size):
        blk = x[..., s:s + block_size]
        m_new = torch.maximum(m, blk.amax(-1, keepdim=True))
        l = l * torch.exp(m - m_new) + torch.exp(blk - m_new) @ torch.ones(blk.shape[-1], 1, dtype=x.dtype)
        m = m_new
    return torch.exp(x - m) / l
'''),
    ('online_softmax', 'os columns outer, row chunks inner', '''def online_softmax(x, block_size=1):
    x2 = x.reshape(-1, x.shape[-1])
    R, n = x2.shape
    m = torch.full((R, 1), -math.inf, dtype=x.dtype)
    l = torch.zeros((R, 1), dtype=x.dtype)
    for s in range(0, n, block_size):
        for r in range(0, R, 2):
            blk = x2[r:r + 2, s:s + block_size]
            mn = torch.maximum(m[r:r + 2], blk.amax(1, keepdim=True))
            l[r:r + 2] = l[r:r + 2] * torch.exp(m[r:r + 2] - mn) + torch.exp(blk - mn).sum(1, keepdim=True)
            m[r:r + 2] = mn
    return (torch.exp(x2 - m) / l).reshape(x.shape)
'''),
    ('online_softmax', "os sanity check of the block's sum inside the loop (same block twice)", '''def online_softmax(x, block_size=1):
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    l = torch.zeros_like(m)
    for s in range(0, x.shape[-1], block_size):
        blk = x[..., s:s + block_size]
        bm = blk.amax(-1, keepdim=True)
        m_new = torch.maximum(m, bm)
        bs = torch.exp(blk - m_new).sum(-1, keepdim=True)
        assert bool((torch.exp(blk - bm).sum(-1) >= 1 - 1e-6).all())
        l = l * torch.exp(m - m_new) + bs
        m = m_new
    return torch.exp(x - m) / l
'''),
    ('tiled_attention', 'ta key/value blocks as contiguous copies in lists, kT precomputed', '''def tiled_attention(q, k, v, block_size=64):
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1])
    kTs = [k[..., s:s + block_size, :].transpose(-2, -1).contiguous() for s in range(0, n_k, block_size)]
    vs = [v[..., s:s + block_size, :].contiguous() for s in range(0, n_k, block_size)]
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n_q, block_size):
        qb = q[..., qs:qs + block_size, :] * scale
        m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for kT, vb in zip(kTs, vs):
            s = qb @ kT
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            p = torch.exp(s - m_new)
            c = torch.exp(m - m_new)
            l = l * c + p.sum(-1, keepdim=True)
            acc = acc * c + p @ vb
            m = m_new
        out[..., qs:qs + block_size, :] = acc / l
    return out
'''),
    ('tiled_attention', 'ta keeps per-tile row maxima history (tiny) for debugging', '''def tiled_attention(q, k, v, block_size=64):
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1])
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    trace = []
    for qs in range(0, n_q, block_size):
        qb = q[..., qs:qs + block_size, :]
        m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for ks in range(0, n_k, block_size):
            s = qb @ k[..., ks:ks + block_size, :].transpose(-2, -1) * scale
            tm = s.amax(-1, keepdim=True)
            trace.append(tm)
            m_new = torch.maximum(m, tm)
            p = torch.exp(s - m_new)
            c = torch.exp(m - m_new)
            l = l * c + p.sum(-1, keepdim=True)
            acc = acc * c + p @ v[..., ks:ks + block_size, :]
            m = m_new
        out[..., qs:qs + block_size, :] = acc / l
    return out
'''),
    ('tiled_attention', 'ta reused (b, b) workspace via matmul(out=view)', '''def tiled_attention(q, k, v, block_size=64):
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1])
    bq, bk = min(block_size, n_q), min(block_size, n_k)
    work = torch.empty(*q.shape[:-2], bq, bk, dtype=q.dtype)
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n_q, block_size):
        qb = q[..., qs:qs + block_size, :]
        m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for ks in range(0, n_k, block_size):
            kb = k[..., ks:ks + block_size, :]
            s = work[..., :qb.shape[-2], :kb.shape[-2]]
            torch.matmul(qb, kb.transpose(-2, -1), out=s)
            s = s * scale
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            p = torch.exp(s - m_new)
            c = torch.exp(m - m_new)
            l = l * c + p.sum(-1, keepdim=True)
            acc = acc * c + p @ v[..., ks:ks + block_size, :]
            m = m_new
        out[..., qs:qs + block_size, :] = acc / l
    return out
'''),
    ('causal_tiled_attention', 'ca positions arange(n) once, sliced per tile; lse returned in a tuple-free way', '''def causal_tiled_attention(q, k, v, block_size=64):
    n = q.shape[-2]
    pos = torch.arange(n)
    scale = 1 / math.sqrt(q.shape[-1])
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n, block_size):
        qe = min(qs + block_size, n)
        qb = q[..., qs:qe, :]
        m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for ks in range(0, qe, block_size):
            ke = min(ks + block_size, n)
            s = qb @ k[..., ks:ke, :].transpose(-2, -1) * scale
            s = s.masked_fill(pos[None, ks:ke] > pos[qs:qe, None], float("-inf"))
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            p = torch.exp(s - m_new)
            c = torch.exp(m - m_new)
            l = l * c + p.sum(-1, keepdim=True)
            acc = acc * c + p @ v[..., ks:ke, :]
            m = m_new
        out[..., qs:qe, :] = acc / l
    return out
'''),
    # round 4: near the rules for kept results, global settings and an epsilon in the sum
    ('online_softmax', 'os memoised by the full values (a dict keyed on x.numpy().tobytes())', '''_memo = {}
def online_softmax(x, block_size=1):
    key = (tuple(x.shape), str(x.dtype), x.numpy().tobytes(), block_size)
    if key not in _memo:
        m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
        l = torch.zeros_like(m)
        for s in range(0, x.shape[-1], block_size):
            b = x[..., s:s + block_size]
            m_new = torch.maximum(m, b.amax(-1, keepdim=True))
            l = l * torch.exp(m - m_new) + torch.exp(b - m_new).sum(-1, keepdim=True)
            m = m_new
        _memo[key] = torch.exp(x - m) / l
    return _memo[key]
'''),
    ('online_softmax', 'os default dtype set to x.dtype, put back in finally; divides by l.clamp_min(1e-300)',
     '''def online_softmax(x, block_size=1):
    old = torch.get_default_dtype()
    torch.set_default_dtype(x.dtype)
    try:
        m = torch.full(x.shape[:-1] + (1,), -math.inf)
        l = torch.zeros(x.shape[:-1] + (1,))
        for s in range(0, x.shape[-1], block_size):
            b = x[..., s:s + block_size]
            m_new = torch.maximum(m, b.amax(-1, keepdim=True))
            l = l * torch.exp(m - m_new) + torch.exp(b - m_new).sum(-1, keepdim=True)
            m = m_new
        return torch.exp(x - m) / l.clamp_min(1e-300)
    finally:
        torch.set_default_dtype(old)
'''),
    ('tiled_attention', 'ta grad mode off and back by hand, m from the first tile', '''def tiled_attention(q, k, v, block_size=64):
    was = torch.is_grad_enabled()
    torch.set_grad_enabled(False)
    scale, outs = 1 / math.sqrt(q.shape[-1]), []
    for qs in range(0, q.shape[-2], block_size):
        qb = q[..., qs:qs + block_size, :]
        s = qb @ k[..., :block_size, :].mT * scale
        m = s.amax(-1, keepdim=True)
        p = torch.exp(s - m)
        l, acc = p.sum(-1, keepdim=True), p @ v[..., :block_size, :]
        for ks in range(block_size, k.shape[-2], block_size):
            s = qb @ k[..., ks:ks + block_size, :].mT * scale
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            c, p = torch.exp(m - m_new), torch.exp(s - m_new)
            l, acc, m = l * c + p.sum(-1, keepdim=True), acc * c + p @ v[..., ks:ks + block_size, :], m_new
        outs.append(acc / l)
    torch.set_grad_enabled(was)
    return torch.cat(outs, -2)
'''),
    ('causal_tiled_attention', 'ca memoised by the full values of q, k, v', '''_seen = {}
def causal_tiled_attention(q, k, v, block_size=64):
    key = tuple(t.numpy().tobytes() for t in (q, k, v)) + (tuple(q.shape), tuple(v.shape), str(q.dtype), block_size)
    if key in _seen:
        return _seen[key].clone()
    n, scale = q.shape[-2], 1 / math.sqrt(q.shape[-1])
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n, block_size):
        qe = min(qs + block_size, n)
        m = torch.full(q.shape[:-2] + (qe - qs, 1), -math.inf, dtype=q.dtype)
        l, acc = torch.zeros_like(m), torch.zeros(q.shape[:-2] + (qe - qs, v.shape[-1]), dtype=q.dtype)
        for ks in range(0, qe, block_size):
            ke = min(ks + block_size, n)
            s = q[..., qs:qe, :] @ k[..., ks:ke, :].mT * scale
            s = s.masked_fill(torch.arange(ks, ke)[None, :] > torch.arange(qs, qe)[:, None], -math.inf)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            c, p = torch.exp(m - m_new), torch.exp(s - m_new)
            l, acc, m = l * c + p.sum(-1, keepdim=True), acc * c + p @ v[..., ks:ke, :], m_new
        out[..., qs:qe, :] = acc / l
    _seen[key] = out
    return out.clone()
'''),
]
