//! The benchmarks' token generator: a fixed LCG, so both bench modes feed the same ids run to run.

/// Token ids for benchmark inputs: any spread over the vocabulary will do (llama-bench uses
/// `std::rand() % n_vocab`); a fixed seed keeps runs comparable.
pub(crate) struct Lcg(pub(crate) u64);

impl Lcg {
    pub(crate) fn below(&mut self, n: u32) -> u32 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (((self.0 >> 32) * u64::from(n)) >> 32) as u32
    }
}
