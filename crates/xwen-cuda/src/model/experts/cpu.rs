//! A missed expert computed by the CPU from the host tier, with llama.cpp's CPU dot products
//! (the bits of `xwen_kernels::vec_dot` on q8 activations, run by the CPU backend's row loop),
//! beside the GPU.

use super::*;

impl ExpertCache {
    /// The CPU's outputs of `jobs` (routed slot index, expert) of layer `il`: each slot's
    /// token's row of `x` (k slots a token, `hidden` values a row) through its expert's gate,
    /// up, SwiGLU and down, on the host copy with the CPU's dot products; `hidden` values a
    /// job, back to back.
    pub(crate) fn cpu_products(&self, il: usize, jobs: &[(usize, usize)], x: &[f32], k: usize) -> Result<Vec<f32>> {
        let (Some(pool), Some(Some(shape))) = (&self.cpu, self.shapes.get(il)) else {
            return Err(CudaError::Unsupported(format!("layer {il}: no CPU path for its experts")));
        };
        let [(tg, ff, hidden, _, _), (tu, _, _, _, _), (td, dn, _, _, _)] = *shape;
        let xs: Vec<&[f32]> = jobs.iter().map(|&(slot, _)| &x[slot / k * hidden..(slot / k + 1) * hidden]).collect();
        // each job's expert's gate, up and down bytes, and whether they are in the device layout
        let experts: Vec<usize> = jobs.iter().map(|&(_, e)| e).collect();
        let handles = match &self.host {
            HostTier::Store { store, .. } => store.experts(il, &experts)?,
            HostTier::Pinned(_) => Vec::new(),
        };
        let mats: Vec<[&[u8]; 3]> = match &self.host {
            HostTier::Pinned(host) => {
                let Some(Some(h)) = host.get(il) else {
                    return Err(CudaError::Unsupported(format!("layer {il} has no host experts")));
                };
                let Some(Some((offs, slot))) = self.slots_at.get(il) else {
                    return Err(CudaError::Unsupported(format!("layer {il} has no experts")));
                };
                experts.iter().map(|&e| std::array::from_fn(|i| &h.all.bytes()[e * slot + offs[i]..e * slot + offs[i] + shape[i].4])).collect()
            }
            HostTier::Store { .. } => handles.iter().map(|h| [h.gate().data, h.up().data, h.down().data]).collect(),
        };
        let dev = matches!(self.host, HostTier::Pinned(_));
        let acts_in: Vec<(Vec<u8>, Vec<u8>)> = xs
            .iter()
            .map(|x| {
                let (mut a, mut b) = (Vec::new(), Vec::new());
                xwen_kernels::quantize_activations(tg, x, &mut a);
                xwen_kernels::quantize_activations(tu, x, &mut b);
                (a, b)
            })
            .collect();
        let [kg, ku, kd] = [tg, tu, td].map(row_kernel);
        let (Some(kg), Some(ku), Some(kd)) = (kg, ku, kd) else {
            return Err(CudaError::Unsupported(format!("layer {il}: no CPU product for its experts' types ({}, {}, {})", tg.name(), tu.name(), td.name())));
        };
        let mid = runs_each(pool, jobs.len(), ff, &|j, r0, y, buf| {
            let mut u = vec![0f32; y.len()];
            dot_run(mats[j][0], shape[0], dev, kg, &acts_in[j].0, r0, y, buf);
            dot_run(mats[j][1], shape[1], dev, ku, &acts_in[j].1, r0, &mut u, buf);
            for (g, u) in y.iter_mut().zip(u) {
                *g = *g / (1.0 + (-*g).exp()) * u;
            }
        });
        let acts_mid: Vec<Vec<u8>> = (0..jobs.len())
            .map(|j| {
                let mut a = Vec::new();
                xwen_kernels::quantize_activations(td, &mid[j * ff..(j + 1) * ff], &mut a);
                a
            })
            .collect();
        Ok(runs_each(pool, jobs.len(), dn, &|j, r0, y, buf| dot_run(mats[j][2], shape[2], dev, kd, &acts_mid[j], r0, y, buf)))
    }

}

/// The CPU's kernel for one row of `ty` (llama.cpp's vec_dot, the bits `xwen_kernels::vec_dot`
/// gives), run by `dot_rows`' loop, which requests the rows ahead of the one it multiplies.
fn row_kernel(ty: GgmlType) -> Option<xwen_kernels::dispatch::RowKernel> {
    let dot = xwen_kernels::dispatch::dot_fn(ty)?;
    Some(xwen_kernels::dispatch::RowKernel { dot, prefetches: false, multi: None, multi_rows: 4, q8_prepared: false })
}

/// Rows `r0..r0 + y.len()` of a matrix (its `shape`; `dev`: in the device layout) times the
/// activations `act`, into `y`, as one run of the CPU backend's row loop (`dot_rows`: the rows
/// ahead of the one multiplied requested from memory — 1.5× the products a row at a time on a
/// 2-core Xeon, the same bits). Where the device pads its blocks (Q8_0, Q6_K) the run is first
/// copied into the file's layout (a sequential read the hardware prefetches by itself).
#[allow(clippy::too_many_arguments)]
fn dot_run(mat: &[u8], shape: Shape, dev: bool, k: xwen_kernels::dispatch::RowKernel, act: &[u8], r0: usize, y: &mut [f32], buf: &mut Vec<u8>) {
    let (ty, rows, cols, drb, _) = shape;
    let file_rb = ty.row_bytes(cols as u64).unwrap_or(0) as usize;
    if !dev || drb == file_rb {
        let w = xwen_kernels::QMatrix { ty, rows, cols, data: &mat[..rows * file_rb] };
        xwen_kernels::dot_rows(&w, k, act, r0, y);
        return;
    }
    let n = y.len();
    let run = crate::layout::file_layout(ty, &mat[r0 * drb..(r0 + n) * drb], buf);
    let w = xwen_kernels::QMatrix { ty, rows: n, cols, data: run };
    xwen_kernels::dot_rows(&w, k, act, 0, y);
}

/// `f(j, r0, y, buf)` for every job `j` < `jobs` and run of rows `r0..r0 + y.len()` of `rows`,
/// into `y` at `j · rows + r0`: a task a job's run of rows on `pool` (`buf`: a task's scratch).
fn runs_each(pool: &xwen_kernels::Pool, jobs: usize, rows: usize, f: &(dyn Fn(usize, usize, &mut [f32], &mut Vec<u8>) + Sync)) -> Vec<f32> {
    const CHUNK: usize = 64;
    let out = SharedOut::new(jobs * rows);
    let chunks = rows.div_ceil(CHUNK);
    pool.run(jobs * chunks, &|t| {
        let (j, c) = (t / chunks, t % chunks);
        let (r0, r1) = (c * CHUNK, ((c + 1) * CHUNK).min(rows));
        let (mut buf, mut y) = (Vec::new(), vec![0f32; r1 - r0]);
        f(j, r0, &mut y, &mut buf);
        for (i, v) in y.into_iter().enumerate() {
            out.put(j * rows + r0 + i, v);
        }
    });
    out.into_vec()
}

/// Floats the pool's tasks write at disjoint indices.
struct SharedOut(Vec<std::sync::atomic::AtomicU32>);

impl SharedOut {
    fn new(n: usize) -> SharedOut {
        SharedOut((0..n).map(|_| std::sync::atomic::AtomicU32::new(0)).collect())
    }

    fn put(&self, i: usize, v: f32) {
        self.0[i].store(v.to_bits(), std::sync::atomic::Ordering::Relaxed);
    }

    fn into_vec(self) -> Vec<f32> {
        self.0.into_iter().map(|a| f32::from_bits(a.into_inner())).collect()
    }
}


#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_each_gives_every_job_and_row_its_value_once() {
        let pool = xwen_kernels::Pool::new(3);
        let got = runs_each(&pool, 3, 150, &|j, r0, y, _| {
            for (i, v) in y.iter_mut().enumerate() {
                *v = (j * 1000 + r0 + i) as f32;
            }
        });
        let want: Vec<f32> = (0..3).flat_map(|j| (0..150).map(move |r| (j * 1000 + r) as f32)).collect();
        assert_eq!(got, want);
    }

    /// A run of rows gives each row the bits of the one-row product, in the file's layout and
    /// in the device's (Q8_0 and Q6_K padded; Q4_K as the file's).
    #[test]
    fn a_run_of_rows_gives_the_bits_of_the_rows_alone() {
        let (rows, cols) = (150, 512);
        let x: Vec<f32> = (0..cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0).collect();
        let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 % 263) as f32 - 131.0) / 97.0).collect();
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0] {
            let file = xwen_kernels::quantize(ty, &w).unwrap();
            let mut act = Vec::new();
            xwen_kernels::quantize_activations(ty, &x, &mut act);
            let rb = ty.row_bytes(cols as u64).unwrap() as usize;
            let want: Vec<u32> = (0..rows).map(|r| xwen_kernels::vec_dot(ty, cols, &file[r * rb..(r + 1) * rb], &act).to_bits()).collect();
            let device = crate::layout::device_layout(ty, &file);
            let drb = crate::layout::device_row_bytes(ty, cols);
            for (data, dev) in [(&file[..], false), (&device[..], true)] {
                let shape = (ty, rows, cols, if dev { drb } else { rb }, data.len());
                let mut got = vec![0f32; rows];
                let mut buf = Vec::new();
                for r0 in (0..rows).step_by(64) {
                    let r1 = (r0 + 64).min(rows);
                    dot_run(data, shape, dev, row_kernel(ty).unwrap(), &act, r0, &mut got[r0..r1], &mut buf);
                }
                assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want, "{} (device layout: {dev})", ty.name());
            }
        }
    }
}
