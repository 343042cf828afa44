//! Tensor names in both file conventions (llama.cpp's GGUF names, transformers' names) for every architecture:
//! the one table the loader, the CPU reference forward and `quantize` read.

use super::config::Arch;

/// Tensor names of one file convention.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Names {
    /// llama.cpp's: `blk.0.attn_q.weight`.
    Gguf,
    /// transformers': `model.layers.0.self_attn.q_proj.weight`.
    Hf,
}

/// What a tensor is in the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Embed,
    Head,
    FinalNorm,
    AttnNorm,
    Q,
    K,
    V,
    O,
    QBias,
    KBias,
    VBias,
    QNorm,
    KNorm,
    /// The norm before the FFN (Llama's `post_attention_layernorm`, Gemma's `pre_feedforward_layernorm`).
    FfnNorm,
    Gate,
    Up,
    Down,
    /// Gemma 3's norms of the attention and FFN outputs.
    PostAttnNorm,
    PostFfnNorm,
}

impl Role {
    /// The decoder's linear layers (what GPTQ quantizes).
    pub fn is_linear(self) -> bool {
        matches!(
            self,
            Role::Q | Role::K | Role::V | Role::O | Role::Gate | Role::Up | Role::Down
        )
    }

    /// (GGUF name, Hugging Face name) as the Llama family has them, without the layer prefix of per-layer roles.
    fn names(self) -> (&'static str, &'static str) {
        match self {
            Role::Embed => ("token_embd.weight", "model.embed_tokens.weight"),
            Role::Head => ("output.weight", "lm_head.weight"),
            Role::FinalNorm => ("output_norm.weight", "model.norm.weight"),
            Role::AttnNorm => ("attn_norm.weight", "input_layernorm.weight"),
            Role::Q => ("attn_q.weight", "self_attn.q_proj.weight"),
            Role::K => ("attn_k.weight", "self_attn.k_proj.weight"),
            Role::V => ("attn_v.weight", "self_attn.v_proj.weight"),
            Role::O => ("attn_output.weight", "self_attn.o_proj.weight"),
            Role::QBias => ("attn_q.bias", "self_attn.q_proj.bias"),
            Role::KBias => ("attn_k.bias", "self_attn.k_proj.bias"),
            Role::VBias => ("attn_v.bias", "self_attn.v_proj.bias"),
            Role::QNorm => ("attn_q_norm.weight", "self_attn.q_norm.weight"),
            Role::KNorm => ("attn_k_norm.weight", "self_attn.k_norm.weight"),
            Role::FfnNorm => ("ffn_norm.weight", "post_attention_layernorm.weight"),
            Role::Gate => ("ffn_gate.weight", "mlp.gate_proj.weight"),
            Role::Up => ("ffn_up.weight", "mlp.up_proj.weight"),
            Role::Down => ("ffn_down.weight", "mlp.down_proj.weight"),
            Role::PostAttnNorm => ("post_attention_norm.weight", "post_attention_norm.weight"),
            Role::PostFfnNorm => ("post_ffw_norm.weight", "post_feedforward_layernorm.weight"),
        }
    }

    /// The name transformers gives `self` in `arch` where it differs from the Llama family's: Gemma 3 names its
    /// four layer norms by their place around the attention and the FFN.
    fn hf_name_in(self, arch: Arch) -> Option<&'static str> {
        match (arch, self) {
            (Arch::Gemma3, Role::FfnNorm) => Some("pre_feedforward_layernorm.weight"),
            (Arch::Gemma3, Role::PostAttnNorm) => Some("post_attention_layernorm.weight"),
            _ => None,
        }
    }
}

impl Names {
    /// The name of `role` (in layer `layer` for per-layer roles) in an `arch` checkpoint.
    pub fn of(self, arch: Arch, role: Role, layer: Option<usize>) -> String {
        let (g, h) = role.names();
        let h = match self {
            Names::Hf => role.hf_name_in(arch).unwrap_or(h),
            Names::Gguf => h,
        };
        match (layer, self) {
            (None, Names::Gguf) => g.into(),
            (None, Names::Hf) => h.into(),
            (Some(i), Names::Gguf) => format!("blk.{i}.{g}"),
            (Some(i), Names::Hf) => format!("model.layers.{i}.{h}"),
        }
    }

    /// [`Names::of`] for a layer's role.
    pub fn layer(self, arch: Arch, i: usize, role: Role) -> String {
        self.of(arch, role, Some(i))
    }
}
