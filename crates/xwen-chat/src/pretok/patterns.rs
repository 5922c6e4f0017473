//! Which regexes each `tokenizer.ggml.pre` value runs, ported verbatim from llama.cpp b11434
//! src/llama-vocab.cpp (`llm_tokenizer_bpe` constructor and the `tokenizer_pre` name table in
//! `llama_vocab::impl::load`). The regex text must stay byte-identical to llama.cpp's: the
//! splitter recognizes its hand-written fast paths by exact string comparison. kimi-k2's only
//! regex, `\p{Han}+`, is such a trigger: the split itself is `custom::kimi_k2`.
//!
//! Not ported (an error at load): pre-tokenizers that need custom code beyond a regex list
//! (afmoe, tiny_aya/cohere2moe, superbpe) and the SPM-style BPE variants that skip the
//! GPT-2 byte encoding (gemma4, mmbert, sarvam-moe, whitespace).

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pre {
    Bailingmoe, Bloom, Chameleon, Chatglm4, Codeshell, CommandR, Dbrx, Deepseek3Llm, DeepseekCoder,
    DeepseekLlm, Default, Exaone, ExaoneMoe, Falcon, Gpt2, Gpt3Finnish, Gpt4o, GraniteDocling,
    GraniteEmbMulti, Grok2, Hunyuan, HunyuanDense, HyV4, Jais, Jais2, JoyaiLlm, KimiK2, Laguna, Llama3,
    Mellum2, Minerva, Minicpm5, MinimaxM2, Mpt, Olmo, Poro, Qwen2, Qwen35, Refact, SeedCoder,
    Smaug, Smollm, SolarOpen, Spark25, Stablelm2, Starcoder, Tekken, Trillion, Ufakzeka, Viking,
    Youtu,
}

#[cfg(test)]
pub(crate) const ALL: &[Pre] = {
    use Pre::*;
    &[
        Bailingmoe, Bloom, Chameleon, Chatglm4, Codeshell, CommandR, Dbrx, Deepseek3Llm, DeepseekCoder,
        DeepseekLlm, Default, Exaone, ExaoneMoe, Falcon, Gpt2, Gpt3Finnish, Gpt4o, GraniteDocling,
        GraniteEmbMulti, Grok2, Hunyuan, HunyuanDense, HyV4, Jais, Jais2, JoyaiLlm, KimiK2, Laguna, Llama3,
        Mellum2, Minerva, Minicpm5, MinimaxM2, Mpt, Olmo, Poro, Qwen2, Qwen35, Refact, SeedCoder,
        Smaug, Smollm, SolarOpen, Spark25, Stablelm2, Starcoder, Tekken, Trillion, Ufakzeka, Viking,
        Youtu,
    ]
};

/// What a `tokenizer.ggml.pre` name selects: the regex set, and whether a word that is itself a
/// token skips the merges (llama.cpp's `ignore_merges`).
pub(crate) struct PreChoice {
    pub pre: Pre,
    pub ignore_merges: bool,
}

/// `None` for a name llama.cpp does not know or that xwen does not implement.
pub(crate) fn choose(name: Option<&str>) -> Option<PreChoice> {
    use Pre::*;
    let (pre, ignore_merges) = match name.unwrap_or("default") {
        "default" => (Default, false),
        "minicpm5" => (Minicpm5, true),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => (Llama3, true),
        "deepseek-llm" => (DeepseekLlm, false),
        "deepseek-coder" => (DeepseekCoder, false),
        "deepseek-v3" => (Deepseek3Llm, false),
        "spark2_5" => (Spark25, false),
        "youtu" => (Youtu, true),
        "falcon" => (Falcon, false),
        "mpt" => (Mpt, false),
        "starcoder" => (Starcoder, false),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "modern-bert" => (Gpt2, false),
        "jais-2" => (Jais2, false),
        "jina-v1-en" | "jina-v2-code" | "roberta-bpe" => (Gpt2, false),
        "refact" => (Refact, false),
        "command-r" => (CommandR, false),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" => (Qwen2, false),
        "qwen35" => (Qwen35, false),
        "stablelm2" => (Stablelm2, false),
        "olmo" => (Olmo, false),
        "dbrx" => (Dbrx, false),
        "smaug-bpe" => (Smaug, false),
        "poro-chat" => (Poro, false),
        "chatglm-bpe" => (Chatglm4, false),
        "glm4" | "glm5" => (Chatglm4, true),
        "viking" => (Viking, false),
        "jais" => (Jais, false),
        "tekken" => (Tekken, true),
        "smollm" => (Smollm, false),
        "codeshell" => (Codeshell, false),
        "bloom" => (Bloom, false),
        "gpt3-finnish" => (Gpt3Finnish, false),
        "exaone" => (Exaone, false),
        "exaone4" => (Gpt2, false),
        "exaone-moe" => (ExaoneMoe, false),
        "chameleon" => (Chameleon, false),
        "minerva-7b" => (Minerva, false),
        "megrez" => (Qwen2, false),
        "gpt-4o" | "llama4" | "kanana2" | "talkie" => (Gpt4o, false),
        "granite-embed-multi-97m" => (GraniteEmbMulti, true),
        "trillion" => (Trillion, false),
        "granite-docling" => (GraniteDocling, false),
        "bailingmoe" | "bailingmoe2" | "llada-moe" => (Bailingmoe, false),
        "seed-coder" => (SeedCoder, false),
        "hunyuan" => (Hunyuan, false),
        "hunyuan-dense" => (HunyuanDense, false),
        "hy_v4" => (HyV4, false),
        "joyai-llm" => (JoyaiLlm, false),
        "kimi-k2" => (KimiK2, false),
        "ufakzeka" => (Ufakzeka, false),
        "grok-2" => (Grok2, false),
        "laguna" => (Laguna, false),
        "minimax-m2" => (MinimaxM2, false),
        "solar-open" => (SolarOpen, false),
        "mellum2" => (Mellum2, false),
        _ => return None,
    };
    Some(PreChoice { pre, ignore_merges })
}

/// The regex list, applied in order: each splits every piece the previous ones left.
#[rustfmt::skip]
pub(crate) fn regexes(pre: Pre) -> &'static [&'static str] {
    match pre {
        Pre::Llama3 => &[
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::Jais2 => &[
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}",
        ],
        Pre::Dbrx | Pre::Smaug => &[
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::DeepseekLlm => &[
            "[\r\n]",
            "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
            "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
            "\\s+$",
            "[一-龥ࠀ-一가-퟿]+",
            "\\p{N}+",
        ],
        Pre::Deepseek3Llm | Pre::HunyuanDense | Pre::JoyaiLlm | Pre::HyV4 => &[
            "\\p{N}{1,3}",
            "[一-龥぀-ゟ゠-ヿ]+",
            "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::Spark25 => &[
            "\\p{N}{1,3}",
            "[一-龥぀-ゟ゠-ヿ]+",
            "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+",
            "\\p{N}",
        ],
        Pre::Youtu => &[
            "[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
            "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::DeepseekCoder => &[
            "[\r\n]",
            "\\s?\\p{L}+",
            "\\s?\\p{P}+",
            "[一-龥ࠀ-一가-퟿]+",
            "\\p{N}",
        ],
        Pre::Falcon => &[
            "[\\p{P}\\$\\+<=>\\^~\\|`]+",
            "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
            "[0-9][0-9][0-9]",
        ],
        Pre::Starcoder | Pre::Refact | Pre::CommandR | Pre::Smollm | Pre::Codeshell | Pre::Exaone | Pre::Minerva | Pre::Mellum2 => &[
            "\\p{N}",
            "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
        ],
        Pre::Gpt2 | Pre::Mpt | Pre::Olmo | Pre::Jais | Pre::Trillion | Pre::GraniteDocling => &[
            "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
        ],
        Pre::Stablelm2 | Pre::Qwen2 | Pre::Hunyuan | Pre::SolarOpen => &[
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::Qwen35 => &[
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::Poro | Pre::Bloom | Pre::Gpt3Finnish => &[
            " ?[^(\\s|.,!?…。，、।۔،)]+",
        ],
        Pre::Chatglm4 => &[
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::Viking => &[
            " ?[^(\\s|.,!?…。，、।۔،)]+",
            "\\p{N}",
        ],
        Pre::Tekken => &[
            "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::Chameleon => &[
            "<sentinel:[0-9]+>",  // Sentinel tokens,
            "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",  // Image tokens,
            "([\\t\\n]|    |  )",  // directly from tokenizer.json,
            "\\p{N}", // Individual digits,
            "[\\p{P}!-/:-@\\[-`{-~]",  // Punctuation, Isolated,
            "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
        ],
        Pre::Gpt4o | Pre::MinimaxM2 => &[
            "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::GraniteEmbMulti => &[
            "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::Bailingmoe => &[
            "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
        ],
        Pre::SeedCoder => &[
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        // Only a trigger: llama.cpp runs its hand-written splitter of the whole K2 pattern for it.
        Pre::KimiK2 => &[
            "\\p{Han}+",
        ],
        Pre::Ufakzeka => &[
            "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::Grok2 => &[
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::Laguna => &[
            "[^\\n]+|[\\n]+",
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::ExaoneMoe => &[
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
        ],
        Pre::Minicpm5 => &[
            "\\p{N}{1,3}",
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::Default => &[
            "[\\p{P}\\$\\+<=>\\^~\\|]+",
            "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
            "\\p{N}+",
            "[0-9][0-9][0-9]",
        ],
    }
}
