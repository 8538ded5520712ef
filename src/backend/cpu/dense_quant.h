// dense and dense_grad_input with a quantized kernel (DType::i8 or DType::nf4, core/quant.h): a
// LoRA run's frozen base (lora.base_dtype). cpu_dense and cpu_dense_grad_input hand such nodes here.
#pragma once
#include <cstdint>

#include "backend/host.h"

namespace loom::cpuk {

void dense_quant(const KernelArgs& a);
KernelScratch dense_quant_workspace(const KernelArgs& a);
void dense_quant_grad_input(const KernelArgs& a);
KernelScratch dense_quant_grad_input_workspace(const KernelArgs& a);

}  // namespace loom::cpuk
