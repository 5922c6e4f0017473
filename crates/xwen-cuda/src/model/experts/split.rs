//! How a decode step's missed experts divide between the CPU and copies over the bus.

/// How many of a decode step's missed experts the CPU computes: the split that makes the CPU's
/// share take as long as the GPU's copies of the rest, from costs measured on earlier steps
/// (moving averages of seconds an expert on each side, and of the GPU part's time with no
/// copies).
#[derive(Clone, Copy, Debug)]
pub(crate) struct CpuSplit {
    cpu_s: f64,
    copy_s: f64,
    gpu_fixed_s: f64,
}

impl Default for CpuSplit {
    fn default() -> Self {
        // first guesses (a 35B-A3B expert, ~1.8 MB: ~40 µs over PCIe 4/5, ~60 µs on 16 cores);
        // the measured costs replace them within a few steps
        CpuSplit { cpu_s: 60e-6, copy_s: 40e-6, gpu_fixed_s: 20e-6 }
    }
}

impl CpuSplit {
    const KEEP: f64 = 0.8;

    /// Misses of `m` to compute on the CPU: c with c·cpu ≈ (m − c)·copy + fixed. On a `probe`
    /// step a side the balance leaves idle gets one miss anyway: a cost is learned only from
    /// steps that use it, so one bad early measurement (cold pages, threads still waking) would
    /// otherwise shut that side out for good.
    pub(crate) fn cpu_count(&self, m: usize, probe: bool) -> usize {
        if m == 0 {
            return 0;
        }
        let c = (m as f64 * self.copy_s + self.gpu_fixed_s) / (self.cpu_s + self.copy_s).max(1e-12);
        let c = (c.round() as usize).min(m);
        match c {
            0 if probe => 1,
            c if probe && c == m && m > 1 => m - 1,
            c => c,
        }
    }

    /// A step's measurement: `c` experts took `t_cpu` on the CPU while the GPU part with `g`
    /// copies took `t_gpu`.
    pub(crate) fn learn(&mut self, c: usize, g: usize, t_cpu: f64, t_gpu: f64) {
        let mix = |old: f64, new: f64| Self::KEEP * old + (1.0 - Self::KEEP) * new;
        if c > 0 {
            self.cpu_s = mix(self.cpu_s, t_cpu / c as f64);
        }
        if g > 0 {
            self.copy_s = mix(self.copy_s, ((t_gpu - self.gpu_fixed_s).max(0.0) / g as f64).max(1e-7));
        } else {
            self.gpu_fixed_s = mix(self.gpu_fixed_s, t_gpu);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_split_balances_the_measured_costs() {
        let mut s = CpuSplit::default();
        // a CPU twice as slow an expert as a copy, no fixed GPU cost: a third on the CPU
        for _ in 0..200 {
            s.learn(2, 0, 2.0 * 40e-6, 0.0);
            s.learn(3, 3, 3.0 * 40e-6, 3.0 * 20e-6);
        }
        assert_eq!(s.cpu_count(9, false), 3);
        assert_eq!(s.cpu_count(0, true), 0);
        // a CPU with nothing to do is never handed more than the misses
        assert!(s.cpu_count(1, false) <= 1);
    }

    #[test]
    fn a_side_priced_out_by_one_bad_step_is_probed_and_comes_back() {
        let mut s = CpuSplit::default();
        // a first CPU step 50x its real cost (cold pages): the balance gives the CPU nothing
        s.learn(1, 0, 50.0 * 40e-6, 0.0);
        for _ in 0..20 {
            s.learn(0, 4, 0.0, 4.0 * 40e-6 + 20e-6);
        }
        assert_eq!(s.cpu_count(4, false), 0);
        assert_eq!(s.cpu_count(4, true), 1);
        // the probes' true cost (as fast as a copy) brings the CPU's share back
        for step in 0..200 {
            let c = s.cpu_count(4, step % 16 == 0);
            s.learn(c, 4 - c, c as f64 * 40e-6, (4 - c) as f64 * 40e-6 + 20e-6);
        }
        assert!(s.cpu_count(4, false) >= 2, "{s:?}");
        // and the copies' side is probed when the CPU would take every miss
        let mut t = CpuSplit { cpu_s: 1e-6, copy_s: 1e-3, gpu_fixed_s: 0.0 };
        assert_eq!(t.cpu_count(3, false), 3);
        assert_eq!(t.cpu_count(3, true), 2);
        t.learn(3, 0, 3e-6, 0.0);
        assert_eq!(t.cpu_count(1, true), 1);
    }
}
