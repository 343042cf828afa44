//! SplitMix64 (Steele, Lea and Flood, 2014): the tests' one small, seeded, reproducible random generator.

#![allow(dead_code)]

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), on a grid of 2^-24 (exact in f32).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        self.unit() * 2.0 - 1.0
    }

    /// `n` values uniform in [-scale, scale).
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32() * scale).collect()
    }

    /// `n` roughly normal values (a sum of 4 uniforms, centred: variance 1/3).
    pub fn normal(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| (0..4).map(|_| self.unit()).sum::<f32>() - 2.0).collect()
    }

    /// Uniform in `0..n` (`n` >= 1).
    pub fn below(&mut self, n: u32) -> u32 {
        (self.next_u64() % n as u64) as u32
    }

    /// A uniform index into `len` items (0 when there are none).
    pub fn index(&mut self, len: usize) -> usize {
        (self.next_u64() % len.max(1) as u64) as usize
    }

    /// A uniform element of a non-empty slice.
    pub fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.index(v.len())]
    }
}
