// The lane split of the CPU-adapter attention kernels (attention_decode_cpu, attention_prefill_cpu): one 8-lane
// subgroup per workgroup, lane j owning the vec4 columns j, j + 8, ... of the head dimension HD; scores in the log2
// domain, NEG the score of a masked key.

const HD4: u32 = HD / 4;
const LANES: u32 = 8u;
const NC: u32 = (HD4 + LANES - 1u) / LANES;  // columns (vec4s of HD) per lane
const NEG: f32 = -1.0e30;
const LOG2E: f32 = 1.4426950408889634;
