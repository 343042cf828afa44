//! topk (and argmax) vs the CPU reference's stable sort: exact. The kernel only compares and copies, so the index
//! lists and the value bits must match (NaN compared as NaN, whatever its payload). Every case runs on the default
//! device (subgroup merge where it has subgroups) and on `gpu_fallback()` (workgroup-shared merge).

use crate::common::{exact, gpu_fallback, Case, Check, Rng};
use shaderlm::gpu::{DType, Gpu};
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::topk;

/// Run topk (or argmax when `argmax`) over `x` as `[rows, n]` and compare ids then value bits with the reference.
fn check(gpu: &Gpu, x: &[f32], rows: usize, n: usize, k: usize, argmax: bool) -> shaderlm::Result<Check> {
    let mut g = Graph::new();
    let tx = g.input("x", &[rows, n], DType::F32);
    let (ids, values) = if argmax {
        (g.argmax(tx)?, None)
    } else {
        g.topk(tx, k).map(|(i, v)| (i, Some(v)))?
    };
    g.output(ids);
    if let Some(v) = values {
        g.output(v);
    }
    let mut plan = Plan::new(gpu, g)?;
    plan.write_input(gpu, tx, bytemuck::cast_slice(x))?;
    plan.run(gpu, &StepVars::default())?;
    let (want_ids, want_values) = topk::reference(x, n, k);
    let bits = |v: &[f32]| -> Vec<u32> {
        v.iter()
            .map(|x| if x.is_nan() { f32::NAN.to_bits() } else { x.to_bits() })
            .collect()
    };
    let mut got = plan.read_u32(ids)?;
    let mut want = want_ids;
    if let Some(v) = values {
        got.extend(bits(&plan.read_f32(v)?));
        want.extend(bits(&want_values));
    }
    Ok(exact(&got, &want))
}

/// A case on both devices: `name` on the default one, `fallback/name` on the one without subgroups.
fn both(v: &mut Vec<Case>, name: String, make: impl Fn(&Gpu) -> (Vec<f32>, usize, usize, usize) + Clone + Send + Sync + 'static) {
    for fallback in [false, true] {
        let make = make.clone();
        let name = if fallback {
            format!("fallback/{name}")
        } else {
            name.clone()
        };
        v.push(Case::new("topk", name, move |gpu| {
            let gpu = if fallback { gpu_fallback() } else { gpu };
            let (x, rows, n, k) = make(gpu);
            check(gpu, &x, rows, n, k, false)
        }));
    }
}

pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    // The grid: random values in [-4, 4) (2^24 levels, so a few ties happen in long rows).
    for n in [1usize, 7, 256, 1000, 49152, 152064] {
        for k in [1usize, 5, 10, 40, 64].into_iter().filter(|&k| k <= n) {
            for rows in [1usize, 3] {
                both(&mut v, format!("n{n}_k{k}_rows{rows}"), move |_| {
                    let mut rng = Rng::new((n * 131 + k * 7 + rows) as u64);
                    (rng.vec(rows * n, 4.0), rows, n, k)
                });
            }
        }
    }
    // argmax through its own builder method, on the vocabulary sizes of the benches.
    for n in [49152usize, 151936, 128256] {
        for fallback in [false, true] {
            let name = format!("{}argmax_n{n}", if fallback { "fallback/" } else { "" });
            v.push(Case::new("topk", name, move |gpu| {
                let gpu = if fallback { gpu_fallback() } else { gpu };
                let x = Rng::new(n as u64).vec(n, 10.0);
                check(gpu, &x, 1, n, 1, true)
            }));
        }
    }
    // Ties: 5 levels only, so hundreds of entries share the maximum; the lowest indices must win.
    for (n, rows) in [(1000usize, 3usize), (49152, 1), (152064, 3)] {
        for k in [1usize, 10, 64] {
            both(&mut v, format!("topk_with_ties_n{n}_k{k}_rows{rows}"), move |_| {
                let mut rng = Rng::new(n as u64 + k as u64);
                ((0..rows * n).map(|_| rng.below(5) as f32).collect(), rows, n, k)
            });
        }
    }
    // All equal: the answer is 0..k.
    for n in [64usize, 152064] {
        both(&mut v, format!("all_equal_n{n}"), move |_| (vec![0.5; 3 * n], 3, n, 64));
    }
    // k == n: the whole row sorted (every slot of the lists and every merge round used).
    for n in [1usize, 5, 40, 64] {
        both(&mut v, format!("k_equals_n{n}"), move |_| {
            (Rng::new(n as u64).vec(3 * n, 1.0), 3, n, n)
        });
    }
    // Negative values only: the key map must order negatives (reversed bits) correctly, and empty slots
    // (key 0) must never beat them.
    for n in [7usize, 1000, 152064] {
        both(&mut v, format!("negative_only_n{n}"), move |_| {
            let x = Rng::new(n as u64)
                .vec(n, 1.0)
                .into_iter()
                .map(|x| -x.abs() - 1e-3)
                .collect();
            (x, 1, n, 10.min(n))
        });
    }
    // -inf entries: ordinary values, ranked last of the numbers; in the short row only 5 entries are above -inf,
    // so 59 -inf entries are picked, lowest index first.
    for n in [100usize, 152064] {
        both(&mut v, format!("neg_inf_n{n}"), move |_| {
            let mut rng = Rng::new(n as u64);
            let x = (0..n)
                .map(|i| if i % 20 == 3 { rng.f32() } else { f32::NEG_INFINITY })
                .collect();
            (x, 1, n, 64.min(n))
        });
    }
    // NaN entries: below -inf; picked only when numbers run out, then lowest index first.
    for n in [100usize, 152064] {
        both(&mut v, format!("nan_n{n}"), move |_| {
            let mut rng = Rng::new(n as u64);
            let x = (0..n)
                .map(|i| match i % 17 {
                    0 => f32::NAN,
                    5 => -f32::NAN,
                    _ => rng.f32(),
                })
                .collect();
            (x, 2, n / 2, 40)
        });
        both(&mut v, format!("nan_beyond_numbers_n{n}"), move |_| {
            let x = (0..n)
                .map(|i| match i % 50 {
                    7 => -1.0,
                    9 => f32::NEG_INFINITY,
                    _ => f32::NAN,
                })
                .collect();
            (x, 1, n, 64)
        });
    }
    // Maximum at the first and at the last index (slice and tail boundaries).
    for n in [1000usize, 49152, 152064] {
        for at_end in [false, true] {
            for k in [1usize, 10] {
                let name = format!("max_at_{}_n{n}_k{k}", if at_end { "last" } else { "first" });
                both(&mut v, name, move |_| {
                    let mut x = Rng::new(n as u64).vec(3 * n, 1.0);
                    for r in 0..3 {
                        x[r * n + if at_end { n - 1 } else { 0 }] = 2.0;
                    }
                    (x, 3, n, k)
                });
            }
        }
    }
    // -0 equals +0 (ties to the lower index) and subnormals order exactly (an FTZ float compare would tie them).
    both(&mut v, "signed_zeros".into(), |_| {
        (
            (0..300).map(|i| if i % 3 == 0 { -0.0 } else { 0.0 }).collect(),
            1,
            300,
            20,
        )
    });
    both(&mut v, "subnormals".into(), |_| {
        let mut rng = Rng::new(9);
        (
            (0..5000)
                .map(|_| f32::from_bits(1 + rng.below(0x7fffff)) * if rng.below(2) == 0 { 1.0 } else { -1.0 })
                .collect(),
            1,
            5000,
            64,
        )
    });
    // Split rows: equal maxima on both sides of each slice boundary (the split the device's kernel uses).
    for n in [32768 + 1, 100_003] {
        both(&mut v, format!("slice_boundaries_n{n}"), move |gpu| {
            let topk::Split { slices, len } = topk::split(1, n, gpu.caps.cpu_adapter);
            let mut x = Rng::new(n as u64).vec(n, 1.0);
            for s in 1..slices {
                x[s * len - 1] = 3.0;
                x[s * len] = 3.0;
            }
            x[n - 1] = 3.0;
            (x, 1, n, 10)
        });
    }
    // Many short rows (a MoE router: 64 experts, top 8).
    both(&mut v, "many_rows_n64_k8".into(), |_| {
        (Rng::new(5).vec(300 * 64, 1.0), 300, 64, 8)
    });
    // Bad arguments are errors, not panics: k = 0, k over 64, k over n, a non-f32 input, a scalar.
    v.push(Case::new("topk", "rejects_bad_arguments", |_| {
        let mut g = Graph::new();
        let x = g.input("x", &[2, 100], DType::F32);
        let short = g.input("short", &[2, 5], DType::F32);
        let ints = g.input("ints", &[2, 100], DType::U32);
        let scalar = g.input("scalar", &[], DType::F32);
        let accepted = [
            g.topk(x, 0).is_ok(),
            g.topk(x, 65).is_ok(),
            g.topk(short, 6).is_ok(),
            g.topk(ints, 1).is_ok(),
            g.argmax(scalar).is_ok(),
        ];
        // Valid calls beside them, to show the rejections are not blanket ones.
        let valid = g.topk(x, 64).is_ok() && g.argmax(short).is_ok();
        let got: Vec<bool> = accepted.into_iter().chain([valid]).collect();
        Ok(exact(&got, &[false, false, false, false, false, true]))
    }));
    v
}
