//! The ridge regression behind `shaderlm eagle-fit` recovers a linear map it is given samples of: next feature =
//! W_e e + W_f f + b, exactly up to the ridge penalty, with fc laid out as EAGLE's `[hidden, 2 hidden]` (embedding
//! columns first) and the bias apart.

mod common;

use common::rng::Rng;
use shaderlm::model::eagle_fit::Ridge;

#[test]
fn ridge_recovers_a_linear_map() {
    let h = 6;
    let mut rng = Rng::new(3);
    let w = rng.vec(h * 2 * h, 1.0); // [h, 2h]
    let b = rng.vec(h, 1.0);
    let mut ridge = Ridge::new(h);
    for _ in 0..200 {
        let e = rng.vec(h, 1.0);
        let f = rng.vec(h, 1.0);
        let y: Vec<f32> = (0..h)
            .map(|r| {
                let x = e.iter().chain(&f);
                b[r] + x.zip(&w[r * 2 * h..(r + 1) * 2 * h]).map(|(a, c)| a * c).sum::<f32>()
            })
            .collect();
        ridge.add(&e, &f, &y);
    }
    let (fc, bias) = ridge.solve(1e-9).unwrap();
    let worst = fc
        .iter()
        .zip(&w)
        .chain(bias.iter().zip(&b))
        .map(|(a, c)| (a - c).abs())
        .fold(0f32, f32::max);
    assert!(worst < 1e-4, "largest weight error {worst}");
    // A strong penalty shrinks the weights but not the bias's role: the fit is no longer exact.
    let (shrunk, _) = ridge.solve(10.0).unwrap();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>();
    assert!(norm(&shrunk) < 0.5 * norm(&w));
    // Too few samples for the inputs and no penalty: refused, not garbage.
    let mut tiny = Ridge::new(h);
    tiny.add(&vec![1.0; h], &vec![1.0; h], &vec![1.0; h]);
    assert!(tiny.solve(0.0).is_err());
}
