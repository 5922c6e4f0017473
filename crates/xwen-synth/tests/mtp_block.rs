//! `xwen synth --mtp`: a preset with the NextN block an official "-MTP" GGUF carries. The file
//! says so in llama.cpp's keys (block_count counts the block, nextn_predict_layers 1, the block
//! flagged full attention), the engine loads the trunk and the head from it, the trunk's logits
//! are the bits of the same preset without the block, and drafting with the head leaves greedy
//! output as it is — dense and MoE.

use xwen_engine::{generate, generate_speculative, EngineConfig, GenerateRequest, LogitsMode, Model, MtpDrafter, Sampler, SamplerConfig};
use xwen_gguf::GgufFile;
use xwen_synth::{write_geometry, Mix, Preset};

fn greedy() -> Sampler {
    Sampler::new(SamplerConfig { temperature: Some(0.0), ..Default::default() }.resolve(false))
}

#[test]
fn an_mtp_preset_carries_a_head_the_engine_drafts_with() {
    let dir = std::env::temp_dir().join(format!("xwen-synth-mtp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for preset in [Preset::Qwen35Tiny, Preset::Qwen35MoeTiny] {
        let g = preset.geometry();
        let (plain_path, mtp_path) = (dir.join(format!("{preset}.gguf")), dir.join(format!("{preset}-mtp.gguf")));
        write_geometry(&g, preset.name(), Mix::Q4KM, &plain_path, None, 3, &mut |_| {}).unwrap();
        let gm = xwen_synth::Geometry { nextn: true, ..g.clone() };
        write_geometry(&gm, preset.name(), Mix::Q4KM, &mtp_path, None, 3, &mut |_| {}).unwrap();

        let f = GgufFile::open(&mtp_path).unwrap();
        let arch = g.arch;
        assert_eq!(f.get_u64(&format!("{arch}.block_count")), Some(g.n_layer as u64 + 1));
        assert_eq!(f.get_u64(&format!("{arch}.nextn_predict_layers")), Some(1));
        assert!(f.tensor(&format!("blk.{}.nextn.eh_proj.weight", g.n_layer)).is_some());
        assert!(f.tensor(&format!("blk.{}.attn_q.weight", g.n_layer)).is_some(), "the block is full attention");

        let cfg = EngineConfig { threads: 2, max_ctx: 256, ..Default::default() };
        let (plain, m) = (Model::load(&plain_path, &cfg).unwrap(), Model::load(&mtp_path, &cfg).unwrap());
        assert!(m.has_mtp() && !plain.has_mtp(), "{preset}");
        let v = m.n_vocab() as u32;
        let prompt: Vec<u32> = (0..9).map(|i| (i * 37 + 5) % v).collect();
        let a = plain.forward(&mut plain.new_state(), &prompt, LogitsMode::All).unwrap();
        let b = m.forward(&mut m.new_state(), &prompt, LogitsMode::All).unwrap();
        assert!(a == b, "{preset}: the trunk of the -MTP file computes what the plain file does");

        let req = GenerateRequest { prompt: &prompt, max_tokens: Some(24), stop_ids: &[], prefill_chunk: 0 };
        let mut want = Vec::new();
        generate(&m, &mut m.new_state(), &req, &mut greedy(), &mut |t| {
            want.push(t);
            true
        })
        .unwrap();
        let mut got = Vec::new();
        let mut d = MtpDrafter::new();
        // a random head is rarely confident: draft whatever it proposes
        d.p_min = 0.0;
        let (_, s) = generate_speculative(&m, &mut m.new_state(), &req, &mut d, 3, &mut greedy(), &mut |_, _| true, &mut |t| {
            got.push(t);
            true
        })
        .unwrap();
        assert_eq!(got, want, "{preset}: drafting with the synthetic head changes nothing");
        assert!(s.drafted() > 0, "{preset}: the head drafted ({s:?})");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
