// The KV cache's element type for the kernels that read it a vec4 of the head dimension at a time (attention_decode,
// attention_decode_cpu, attention_prefill, attention_sparse, kv_compress): f32, or (KV_F16) halves packed two to a
// u32 as pack2x16float writes them (element 2i in the low half), so four elements are one vec2<u32>. The including
// shader declares its cache bindings as array<kv4> ([n_kv, max_ctx, HD]) and reads them through kv_load.

#if KV_F16
alias kv4 = vec2<u32>;

fn kv_load(w: kv4) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}
#else
alias kv4 = vec4<f32>;

fn kv_load(w: kv4) -> vec4<f32> {
    return w;
}
#endif
