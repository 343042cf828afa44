//! rope_kv vs the CPU references it fuses (rms_norm of each head, rope of q and k, kv_write of k and v), against
//! the unfused kernels (rms_norm + rope_pair + kv_write_pair), and rows of a step against one-token steps.
//!
//! Metric: rel+abs over the rotated q and both whole caches (which start random, so a stray or missing write is an
//! O(1) error), with rope's bound (tests/ops/rope.rs): rtol = 2^-20, atol = attn_factor * 2 * X * (A * 2^-21 +
//! 2^-16), A the largest angle and X the largest magnitude entering the rotation (1 for raw inputs in [-1, 1)).
//! With the q/k norms, the kernel's serial f32 sum of squares over head_dim values adds up to head_dim * 2^-24
//! relative to the norm, so rtol = 2^-20 + head_dim * 2^-23. The unfused kernels run the same rotation code (lib/
//! rope_angle.wgsl) and norm in another order, so they are held to the same bound.

use crate::common::{exact, rel_abs, Case, Check, Rng};
use shaderlm::gpu::{DType, Gpu, GpuTensor};
use shaderlm::graph::{Graph, Plan, StepVars, TensorId};
use shaderlm::ops::rope::{RopeConfig, RopeStyle};
use shaderlm::ops::rope_kv::{self, HostQkv, QkvDims, QkvSource};

#[derive(Clone, Copy)]
struct Setup {
    dims: QkvDims,
    style: RopeStyle,
    rot_dim: usize,
    /// How many of q, k, v each source tensor holds: [3] one stacked tensor, [2, 1] q|k and v, [1, 1, 1] three.
    groups: &'static [usize],
    norm: bool,
    factors: bool,
    attn_factor: f32,
}

/// The case's host data: q|k|v rows, the norm weights, the divisors, the caches' initial values.
struct Data {
    qkv: Vec<f32>,
    qk_norm: Vec<f32>,
    factors: Vec<f32>,
    cache: Vec<f32>,
}

impl Setup {
    fn cols(&self) -> [usize; 3] {
        let d = self.dims;
        [d.n_heads * d.head_dim, d.n_kv * d.head_dim, d.n_kv * d.head_dim]
    }

    fn cfg(&self, factors: Option<TensorId>) -> RopeConfig {
        let mut cfg = RopeConfig::new(self.style, 10000.0, self.rot_dim);
        cfg.freq_scale = 0.5;
        cfg.attn_factor = self.attn_factor;
        cfg.factors = factors;
        cfg
    }

    fn data(&self, seed: u64) -> Data {
        let d = self.dims;
        let mut rng = Rng::new(seed);
        let width: usize = self.cols().iter().sum();
        Data {
            qkv: rng.vec(d.n_tokens * width, 1.0),
            qk_norm: (0..2 * d.head_dim).map(|_| 1.0 + 0.5 * rng.f32()).collect(),
            factors: (0..self.rot_dim / 2).map(|_| 1.0 + 3.0 * rng.unit()).collect(),
            cache: rng.vec(d.n_kv * d.max_ctx * d.head_dim, 1.0),
        }
    }

    /// The source tensors' rows: each group's columns of the stacked rows.
    fn group_rows(&self, qkv: &[f32]) -> Vec<Vec<f32>> {
        let cols = self.cols();
        let (mut p, mut from) = (0, 0);
        let width: usize = cols.iter().sum();
        let mut out = Vec::new();
        for &count in self.groups {
            let w: usize = cols[p..p + count].iter().sum();
            out.push(qkv.chunks(width).flat_map(|r| r[from..from + w].to_vec()).collect());
            (p, from) = (p + count, from + w);
        }
        out
    }

    /// q, k, v `[n_tokens, cols]` from the stacked rows.
    fn split(&self, qkv: &[f32]) -> [Vec<f32>; 3] {
        let [q, k, v] = self.cols();
        let rows = |from: usize, w: usize| -> Vec<f32> {
            qkv.chunks(q + k + v).flat_map(|r| r[from..from + w].to_vec()).collect()
        };
        [rows(0, q), rows(q, k), rows(q + k, v)]
    }

    fn bound(&self, data: &Data, pos: u32) -> (f64, f64) {
        let d = self.dims;
        let min_factor = if self.factors {
            data.factors.iter().fold(f32::MAX, |m, &v| m.min(v)) as f64
        } else {
            1.0
        };
        let angle = (pos as f64 + d.n_tokens as f64) * 0.5 / min_factor;
        // Normed heads: |x| / rms is at most sqrt(head_dim), times weights below 1.5.
        let mag = if self.norm { 1.5 * (d.head_dim as f64).sqrt() } else { 1.0 };
        let atol = self.attn_factor as f64 * 2.0 * mag * (angle * 2f64.powi(-21) + 2f64.powi(-16));
        let norm_rtol = if self.norm { d.head_dim as f64 * 2f64.powi(-23) } else { 0.0 };
        (2f64.powi(-20) + norm_rtol, atol)
    }
}

/// The graph's tensors: the q|k|v input(s), the norm weights and divisors, and the caches.
struct Io {
    sources: Vec<TensorId>,
    qk_norm: TensorId,
    factors: TensorId,
    caches: (TensorId, TensorId),
}

fn inputs(g: &mut Graph, s: &Setup, kc: &GpuTensor, vc: &GpuTensor) -> Io {
    let d = s.dims;
    let cols = s.cols();
    let mut p = 0;
    let mut sources = Vec::new();
    for &count in s.groups {
        let w: usize = cols[p..p + count].iter().sum();
        sources.push(g.input(&format!("source{p}"), &[d.n_tokens, w], DType::F32));
        p += count;
    }
    Io {
        sources,
        qk_norm: g.input("qk_norm", &[2, d.head_dim], DType::F32),
        factors: g.input("factors", &[s.rot_dim / 2], DType::F32),
        caches: (g.external(kc), g.external(vc)),
    }
}

fn write_inputs(gpu: &Gpu, plan: &Plan, s: &Setup, io: &Io, data: &Data) -> shaderlm::Result<()> {
    for (&t, v) in io.sources.iter().zip(&s.group_rows(&data.qkv)) {
        plan.write_input(gpu, t, bytemuck::cast_slice(v))?;
    }
    plan.write_input(gpu, io.qk_norm, bytemuck::cast_slice(&data.qk_norm))?;
    plan.write_input(gpu, io.factors, bytemuck::cast_slice(&data.factors))
}

fn caches(gpu: &Gpu, s: &Setup, data: &Data) -> shaderlm::Result<(GpuTensor, GpuTensor)> {
    let d = s.dims;
    let shape = [d.n_kv, d.max_ctx, d.head_dim];
    Ok((
        GpuTensor::upload_f32(gpu, "k_cache", &shape, &data.cache)?,
        GpuTensor::upload_f32(gpu, "v_cache", &shape, &data.cache)?,
    ))
}

fn source(s: &Setup, io: &Io) -> QkvSource {
    QkvSource(io.sources.iter().copied().zip(s.groups.iter().copied()).collect())
}

/// The fused kernel through one plan at each of `positions` (caches carried over), against the CPU references.
fn vs_reference(gpu: &Gpu, s: &Setup, positions: &[u32], seed: u64) -> shaderlm::Result<Check> {
    let data = s.data(seed);
    let (kc, vc) = caches(gpu, s, &data)?;
    let mut g = Graph::new();
    let io = inputs(&mut g, s, &kc, &vc);
    let src = source(s, &io);
    let norm = s.norm.then_some((io.qk_norm, 1e-6));
    let cfg = s.cfg(s.factors.then_some(io.factors));
    let q = g.rope_kv(src, norm, cfg, io.caches.0, io.caches.1)?;
    g.output(q);
    let mut plan = Plan::new(gpu, g)?;
    write_inputs(gpu, &plan, s, &io, &data)?;
    let (mut want_k, mut want_v) = (data.cache.clone(), data.cache.clone());
    let [hq, hk, hv] = s.split(&data.qkv);
    let host = HostQkv {
        q: &hq,
        k: &hk,
        v: &hv,
        qk_norm: norm.map(|(_, eps)| (data.qk_norm.as_slice(), eps)),
        factors: s.factors.then_some(data.factors.as_slice()),
    };
    let mut worst = Check::RelAbs { worst: 0.0, at: 0 };
    for &pos in positions {
        plan.run(gpu, &StepVars { pos })?;
        let want_q = rope_kv::reference(s.dims, &cfg, &host, pos, &mut want_k, &mut want_v);
        let got = [plan.read_f32(q)?, kc.download_f32(gpu)?, vc.download_f32(gpu)?].concat();
        let (rtol, atol) = s.bound(&data, pos);
        let c = rel_abs(&got, &[want_q, want_k.clone(), want_v.clone()].concat(), rtol, atol);
        if !c.passed() {
            return Ok(c);
        }
        worst = c;
    }
    Ok(worst)
}

/// The fused kernel against rms_norm + rope_pair + kv_write_pair on the same inputs (split sources).
fn vs_unfused(gpu: &Gpu, s: &Setup, pos: u32, seed: u64) -> shaderlm::Result<Check> {
    let data = s.data(seed);
    let d = s.dims;
    let (kc, vc) = caches(gpu, s, &data)?;
    let (kc2, vc2) = caches(gpu, s, &data)?;
    let mut g = Graph::new();
    let io = inputs(&mut g, s, &kc, &vc);
    let (ukc, uvc) = (g.external(&kc2), g.external(&vc2));
    let (eps, cfg) = (1e-6, s.cfg(s.factors.then_some(io.factors)));
    let [tq, tk, tv] = io.sources[..] else {
        unreachable!("split sources")
    };
    let fused = g.rope_kv(
        QkvSource::split(tq, tk, tv),
        s.norm.then_some((io.qk_norm, eps)),
        cfg,
        io.caches.0,
        io.caches.1,
    )?;
    let q = g.reshape(tq, &[d.n_tokens, d.n_heads, d.head_dim])?;
    let k = g.reshape(tk, &[d.n_tokens, d.n_kv, d.head_dim])?;
    let v = g.reshape(tv, &[d.n_tokens, d.n_kv, d.head_dim])?;
    let norms = s.norm.then(|| (g.input("qn", &[d.head_dim], DType::F32), g.input("kn", &[d.head_dim], DType::F32)));
    let (q, k) = match norms {
        Some((qn, kn)) => (g.rms_norm(q, qn, eps)?, g.rms_norm(k, kn, eps)?),
        None => (q, k),
    };
    let (q2, k2) = g.rope_pair(q, k, cfg)?;
    g.kv_write_pair(k2, v, ukc, uvc)?;
    g.output(fused);
    g.output(q2);
    let plan = Plan::new(gpu, g)?;
    write_inputs(gpu, &plan, s, &io, &data)?;
    if let Some((qn, kn)) = norms {
        plan.write_input(gpu, qn, bytemuck::cast_slice(&data.qk_norm[..d.head_dim]))?;
        plan.write_input(gpu, kn, bytemuck::cast_slice(&data.qk_norm[d.head_dim..]))?;
    }
    compare_unfused(gpu, s, &data, plan, pos, (fused, q2), [&kc, &vc, &kc2, &vc2])
}

fn compare_unfused(
    gpu: &Gpu,
    s: &Setup,
    data: &Data,
    mut plan: Plan,
    pos: u32,
    (fused, unfused): (TensorId, TensorId),
    [kc, vc, ukc, uvc]: [&GpuTensor; 4],
) -> shaderlm::Result<Check> {
    plan.run(gpu, &StepVars { pos })?;
    let got = [plan.read_f32(fused)?, kc.download_f32(gpu)?, vc.download_f32(gpu)?].concat();
    let want = [plan.read_f32(unfused)?, ukc.download_f32(gpu)?, uvc.download_f32(gpu)?].concat();
    let (rtol, atol) = s.bound(data, pos);
    Ok(rel_abs(&got, &want, rtol, atol))
}

/// A step of n tokens at pos against n one-token steps at pos .. pos + n: q rows and caches bit for bit.
fn batch_rows_equal_one_row(gpu: &Gpu, s: &Setup, pos: u32, seed: u64) -> shaderlm::Result<Check> {
    let data = s.data(seed);
    let d = s.dims;
    let run = |n: usize, rows: &[f32], at: u32, kc: &GpuTensor, vc: &GpuTensor| -> shaderlm::Result<Vec<f32>> {
        let one = Setup {
            dims: QkvDims { n_tokens: n, ..d },
            ..*s
        };
        let mut g = Graph::new();
        let io = inputs(&mut g, &one, kc, vc);
        let cfg = one.cfg(one.factors.then_some(io.factors));
        let q = g.rope_kv(
            QkvSource::stacked(io.sources[0]),
            one.norm.then_some((io.qk_norm, 1e-6)),
            cfg,
            io.caches.0,
            io.caches.1,
        )?;
        g.output(q);
        let mut plan = Plan::new(gpu, g)?;
        let part = Data {
            qkv: rows.to_vec(),
            qk_norm: data.qk_norm.clone(),
            factors: data.factors.clone(),
            cache: Vec::new(),
        };
        write_inputs(gpu, &plan, &one, &io, &part)?;
        plan.run(gpu, &StepVars { pos: at })?;
        plan.read_f32(q)
    };
    let (kc, vc) = caches(gpu, s, &data)?;
    let batch_q = run(d.n_tokens, &data.qkv, pos, &kc, &vc)?;
    let (kc1, vc1) = caches(gpu, s, &data)?;
    let width = data.qkv.len() / d.n_tokens;
    let mut rows_q = Vec::new();
    for (t, row) in data.qkv.chunks(width).enumerate() {
        rows_q.extend(run(1, row, pos + t as u32, &kc1, &vc1)?);
    }
    let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let got = [batch_q, kc.download_f32(gpu)?, vc.download_f32(gpu)?].concat();
    let want = [rows_q, kc1.download_f32(gpu)?, vc1.download_f32(gpu)?].concat();
    Ok(exact(&bits(got), &bits(want)))
}

fn setup(n_tokens: usize, n_heads: usize, n_kv: usize, head_dim: usize, max_ctx: usize) -> Setup {
    Setup {
        dims: QkvDims {
            n_tokens,
            n_heads,
            n_kv,
            head_dim,
            max_ctx,
        },
        style: RopeStyle::RotateHalf,
        rot_dim: head_dim,
        groups: &[3],
        norm: false,
        factors: false,
        attn_factor: 1.0,
    }
}

pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    let mut add = |name: &str, s: Setup, positions: &'static [u32]| {
        let seed = 500 + v.len() as u64;
        let name = format!(
            "{name}_t{}_h{}_kv{}_d{}{}{}{}",
            s.dims.n_tokens,
            s.dims.n_heads,
            s.dims.n_kv,
            s.dims.head_dim,
            match s.groups {
                [3] => "",
                [2, 1] => "_qk_v",
                [1, 2] => "_q_kv",
                _ => "_split",
            },
            if s.norm { "_norm" } else { "" },
            if s.factors { "_factors" } else { "" },
        );
        v.push(Case::new("rope_kv", name, move |gpu| vs_reference(gpu, &s, positions, seed)));
    };
    let smol = setup(1, 9, 3, 64, 40);
    add("decode_steps_reuse_plan", smol, &[0, 1, 2, 39]);
    add("interleaved", Setup { style: RopeStyle::Interleaved, ..smol }, &[5]);
    add("split", Setup { groups: &[1, 1, 1], ..smol }, &[7]);
    add("qk_then_v", Setup { groups: &[2, 1], ..setup(3, 14, 2, 64, 40) }, &[9]);
    add("q_then_kv", Setup { groups: &[1, 2], norm: true, ..setup(2, 8, 4, 64, 40) }, &[4]);
    add("chunk", setup(37, 14, 2, 64, 300), &[0, 100]);
    add("qk_norm", Setup { norm: true, ..setup(5, 8, 2, 128, 64) }, &[3]);
    add("qk_norm_split_factors", Setup { norm: true, groups: &[1, 1, 1], factors: true, ..setup(3, 4, 1, 256, 32) }, &[20]);
    add("factors_attn_factor", Setup { factors: true, attn_factor: 1.2, ..setup(4, 6, 2, 96, 64) }, &[30000 % 60]);
    // Phi-3's partial rotation: dims from rot_dim on pass through (normed with the q/k norms).
    add("partial_rotary", Setup { rot_dim: 24, ..setup(3, 4, 2, 80, 16) }, &[2]);
    add("partial_rotary_odd_dim", Setup { rot_dim: 6, norm: true, ..setup(2, 3, 3, 7, 9) }, &[1]);
    // pos + n_tokens > max_ctx: the tokens that fit are cached, q is rotated for every token.
    add("past_end_dropped", setup(5, 3, 3, 64, 20), &[18]);
    add("long_prefill", setup(130, 9, 3, 64, 130), &[0]);
    for (name, s, pos) in [
        ("unfused", Setup { groups: &[1, 1, 1], ..setup(3, 9, 3, 64, 40) }, 11u32),
        ("unfused_norm_factors", Setup { groups: &[1, 1, 1], norm: true, factors: true, ..setup(5, 8, 2, 128, 64) }, 7),
        ("unfused_interleaved_partial", Setup { groups: &[1, 1, 1], style: RopeStyle::Interleaved, rot_dim: 32, ..setup(2, 4, 4, 64, 8) }, 3),
    ] {
        v.push(Case::new("rope_kv", name, move |gpu| vs_unfused(gpu, &s, pos, 900)));
    }
    for (name, s) in [
        ("batch_rows_equal_one_row", setup(8, 9, 3, 64, 40)),
        ("batch_rows_equal_one_row_norm_factors", Setup { norm: true, factors: true, ..setup(5, 8, 2, 128, 64) }),
    ] {
        v.push(Case::new("rope_kv", name, move |gpu| batch_rows_equal_one_row(gpu, &s, 17, 901)));
    }
    // The builder rejects sources that do not hold q, k and v once each in whole heads, and bad caches or norms.
    v.push(Case::new("rope_kv", "rejects_bad_sources", |gpu| {
        let cache = GpuTensor::zeros(gpu, "c", &[2, 16, 8], DType::F32)?;
        let mut g = Graph::new();
        let (kc, vc) = (g.external(&cache), g.external(&cache));
        let qkv = g.input("qkv", &[3, 6 * 8], DType::F32);
        let odd = g.input("odd", &[3, 6 * 8 + 3], DType::F32);
        let kv = g.input("kv", &[3, 2 * 16], DType::F32);
        let kv4 = g.input("kv4", &[4, 2 * 16], DType::F32);
        let small_cache = g.input("small", &[2, 2, 8], DType::F32);
        let norm = g.input("norm", &[8], DType::F32);
        let cfg = RopeConfig::new(RopeStyle::RotateHalf, 10000.0, 8);
        let mut errs = vec![
            g.rope_kv(QkvSource(vec![(qkv, 2)]), None, cfg, kc, vc).is_err(),
            g.rope_kv(QkvSource(vec![(qkv, 3), (kv, 0)]), None, cfg, kc, vc).is_err(),
            g.rope_kv(QkvSource::stacked(odd), None, cfg, kc, vc).is_err(),
            g.rope_kv(QkvSource(vec![(qkv, 1), (kv4, 2)]), None, cfg, kc, vc).is_err(),
            g.rope_kv(QkvSource::stacked(qkv), Some((norm, 1e-6)), cfg, kc, vc).is_err(),
            g.rope_kv(QkvSource::stacked(qkv), None, cfg, kc, small_cache).is_err(),
            g.rope_kv(QkvSource::stacked(qkv), None, RopeConfig::new(RopeStyle::RotateHalf, 1e4, 10), kc, vc).is_err(),
        ];
        errs.push(g.rope_kv(QkvSource(vec![(qkv, 1), (kv, 2)]), None, cfg, kc, vc).is_ok());
        Ok(exact(&errs, &[true; 8]))
    }));
    tree_cases(&mut v);
    v
}

/// Tree form: a step over the nodes of a random draft tree (node t cached in slot pos + t, rotated at pos + its
/// depth) against one-token steps at each node's position, bit for bit (q rows and the cached rows), and against
/// the CPU reference within rope's bound.
fn tree_rows_equal_one_row(gpu: &Gpu, s: &Setup, pos: u32, seed: u64) -> shaderlm::Result<Check> {
    use shaderlm::ops::attention_decode::{tree_table, TREE_W};
    let data = s.data(seed);
    let d = s.dims;
    let paths = crate::attention_decode::random_tree(&mut Rng::new(seed), d.n_tokens);
    let table = tree_table(paths.iter().map(Vec::as_slice))?;
    let run = |n: usize, rows: &[f32], at: u32, tree: Option<&[u32]>| -> shaderlm::Result<[Vec<f32>; 3]> {
        let one = Setup {
            dims: QkvDims { n_tokens: n, ..d },
            ..*s
        };
        let (kc, vc) = caches(gpu, s, &data)?;
        let mut g = Graph::new();
        let io = inputs(&mut g, &one, &kc, &vc);
        let cfg = one.cfg(one.factors.then_some(io.factors));
        let tt = tree.map(|_| g.input("tree", &[n, TREE_W], DType::U32));
        let src = QkvSource::stacked(io.sources[0]);
        let q = g.rope_kv_tree(src, one.norm.then_some((io.qk_norm, 1e-6)), cfg, io.caches, tt)?;
        g.output(q);
        let mut plan = Plan::new(gpu, g)?;
        let part = Data {
            qkv: rows.to_vec(),
            qk_norm: data.qk_norm.clone(),
            factors: data.factors.clone(),
            cache: Vec::new(),
        };
        write_inputs(gpu, &plan, &one, &io, &part)?;
        if let (Some(t), Some(tab)) = (tt, tree) {
            plan.write_input(gpu, t, bytemuck::cast_slice(tab))?;
        }
        plan.run(gpu, &StepVars { pos: at })?;
        Ok([plan.read_f32(q)?, kc.download_f32(gpu)?, vc.download_f32(gpu)?])
    };
    let [tree_q, tree_k, tree_v] = run(d.n_tokens, &data.qkv, pos, Some(&table))?;
    let width = data.qkv.len() / d.n_tokens;
    let (mut want_q, mut want_k, mut want_v) = (Vec::new(), data.cache.clone(), data.cache.clone());
    for (t, row) in data.qkv.chunks(width).enumerate() {
        let at = pos as usize + paths[t].len() - 1;
        let [q, k, v] = run(1, row, at as u32, None)?;
        want_q.extend(q);
        for h in 0..d.n_kv {
            let (src, dst) = ((h * d.max_ctx + at) * d.head_dim, (h * d.max_ctx + pos as usize + t) * d.head_dim);
            want_k[dst..dst + d.head_dim].copy_from_slice(&k[src..src + d.head_dim]);
            want_v[dst..dst + d.head_dim].copy_from_slice(&v[src..src + d.head_dim]);
        }
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let got = [tree_q.clone(), tree_k.clone(), tree_v.clone()].concat();
    let check = exact(&bits(&got), &bits(&[want_q, want_k, want_v].concat()));
    if !check.passed() {
        return Ok(check);
    }
    // The CPU reference of the tree form.
    let [q, k, v] = s.split(&data.qkv);
    let host = HostQkv {
        q: &q,
        k: &k,
        v: &v,
        qk_norm: s.norm.then_some((data.qk_norm.as_slice(), 1e-6)),
        factors: s.factors.then_some(data.factors.as_slice()),
    };
    let (mut kc, mut vc) = (data.cache.clone(), data.cache.clone());
    let rq = rope_kv::reference_tree(d, &s.cfg(None), &host, (pos, &table), &mut kc, &mut vc);
    let (rtol, atol) = s.bound(&data, pos);
    Ok(rel_abs(&got, &[rq, kc, vc].concat(), rtol, atol))
}

pub fn tree_cases(v: &mut Vec<Case>) {
    for (name, s) in [
        ("tree_rows_equal_one_row", setup(13, 9, 3, 64, 64)),
        ("tree_rows_equal_one_row_norm_factors", Setup { norm: true, factors: true, ..setup(9, 8, 2, 128, 64) }),
        ("tree_rows_equal_one_row_61", Setup { style: RopeStyle::Interleaved, ..setup(61, 9, 3, 64, 128) }),
    ] {
        v.push(Case::new("rope_kv", name, move |gpu| tree_rows_equal_one_row(gpu, &s, 21, 902)));
    }
}
