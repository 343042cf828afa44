// Words per 32-weight block of the packed layouts (src/quant/pack.rs), for one row: WQ quant words (4 nibble words,
// or 8 byte words with Q8), then the high-bit words (HB1: bit 4 of each weight, Q5; HB2: bits 4 and 5, Q6_K).

#if Q8
const WQ = 8u;  // quant words per block
#else
const WQ = 4u;
#endif
#if HB2
const WB = WQ + 2u;  // device words per block: quant words, then high-bit words
#else
#if HB1
const WB = WQ + 1u;
#else
const WB = WQ;
#endif
#endif
