//! A missed expert computed by the CPU from the host tier, with llama.cpp's CPU dot products
//! (`xwen_kernels::vec_dot` on q8 activations), beside the GPU.

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
        let [(tg, ff, hidden, _, _), (tu, _, _, _, _), (td, dn, eff, _, _)] = *shape;
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
        let mid = rows_each(pool, jobs.len(), ff, &|j, r, buf| {
            let g = xwen_kernels::vec_dot(tg, hidden, row_of(mats[j][0], shape[0], dev, r, buf), &acts_in[j].0);
            let u = xwen_kernels::vec_dot(tu, hidden, row_of(mats[j][1], shape[1], dev, r, buf), &acts_in[j].1);
            g / (1.0 + (-g).exp()) * u
        });
        let acts_mid: Vec<Vec<u8>> = (0..jobs.len())
            .map(|j| {
                let mut a = Vec::new();
                xwen_kernels::quantize_activations(td, &mid[j * ff..(j + 1) * ff], &mut a);
                a
            })
            .collect();
        Ok(rows_each(pool, jobs.len(), dn, &|j, r, buf| xwen_kernels::vec_dot(td, eff, row_of(mats[j][2], shape[2], dev, r, buf), &acts_mid[j])))
    }

}

/// Row `r` of a matrix (`dev`: in the device layout, else the file's) in the CPU's layout.
fn row_of<'a>(mat: &'a [u8], shape: Shape, dev: bool, r: usize, buf: &'a mut Vec<u8>) -> &'a [u8] {
    let (ty, _, cols, drb, _) = shape;
    if dev {
        crate::layout::file_layout(ty, &mat[r * drb..(r + 1) * drb], buf)
    } else {
        let rb = ty.row_bytes(cols as u64).unwrap_or(0) as usize;
        &mat[r * rb..(r + 1) * rb]
    }
}

/// `f(j, r, buf)` for every job `j` < `jobs` and row `r` < `rows`, at `j · rows + r`: a task
/// a job's chunk of rows on `pool` (`buf`: a task's scratch).
fn rows_each(pool: &xwen_kernels::Pool, jobs: usize, rows: usize, f: &(dyn Fn(usize, usize, &mut Vec<u8>) -> f32 + Sync)) -> Vec<f32> {
    const CHUNK: usize = 64;
    let out = SharedOut::new(jobs * rows);
    let chunks = rows.div_ceil(CHUNK);
    pool.run(jobs * chunks, &|t| {
        let (j, c) = (t / chunks, t % chunks);
        let mut buf = Vec::new();
        for r in c * CHUNK..((c + 1) * CHUNK).min(rows) {
            out.put(j * rows + r, f(j, r, &mut buf));
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
    fn rows_each_gives_every_job_and_row_its_value_once() {
        let pool = xwen_kernels::Pool::new(3);
        let got = rows_each(&pool, 3, 150, &|j, r, _| (j * 1000 + r) as f32);
        let want: Vec<f32> = (0..3).flat_map(|j| (0..150).map(move |r| (j * 1000 + r) as f32)).collect();
        assert_eq!(got, want);
    }
}
