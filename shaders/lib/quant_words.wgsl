// Words per 32-weight block of the packed layouts (src/quant/pack.rs), for one row: WQ quant words (4 nibble words,
// 8 byte words with Q8, 2 words of 2-bit fields with SUPER), then the high-bit words (HB1: bit 4 of each weight, Q5;
// HB2: bits 4 and 5, Q6_K; Q3K: bit 2, Q3_K).

#if Q8
const WQ = 8u;  // quant words per block
#else
#if SUPER
const WQ = 2u;
#else
const WQ = 4u;
#endif
#endif
#if HB2
const WB = WQ + 2u;  // device words per block: quant words, then high-bit words
#else
#if HB1
const WB = WQ + 1u;
#else
#if Q3K
const WB = WQ + 1u;
#else
const WB = WQ;
#endif
#endif
#endif
