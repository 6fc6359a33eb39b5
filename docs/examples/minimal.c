/* The smallest complete use of Strata's C API: one runtime, one tensor on NVMe, one layer of
 * one step. Build: cc -std=c11 minimal.c $(pkg-config --cflags --libs strata)
 * Run: ./a.out /path/to/nvme/dir */
#include <stdio.h>
#include <strata/strata.h>
#include <string.h>

#define CHECK(call)                                                                                \
  do {                                                                                             \
    int rc_ = (call);                                                                              \
    if (rc_ != STRATA_OK) {                                                                        \
      fprintf(stderr, "%s failed: %s (%s)\n", #call, strata_strerror(rc_), strata_last_error(rt)); \
      strata_runtime_destroy(rt);                                                                  \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

int main(int argc, char** argv) {
  strata_runtime* rt = NULL;
  strata_config config;
  strata_config_init(&config);
  config.nvme_path = argc > 1 ? argv[1] : ".";
  config.nvme_capacity_bytes = 64u << 20;
  config.pinned_budget_bytes = 16u << 20;
  config.device_budget_bytes = 16u << 20;
  CHECK(strata_runtime_create(&config, &rt));

  /* A 1 MiB bf16 weight of layer 0 that rests on NVMe. */
  strata_tensor_desc desc;
  memset(&desc, 0, sizeof desc);
  desc.struct_size = sizeof desc;
  desc.name = "layers.0.mlp.up_proj.weight";
  desc.bytes = 1u << 20;
  desc.dtype = STRATA_DTYPE_BF16;
  desc.kind = STRATA_KIND_PARAMETER;
  desc.layer = 0;
  desc.home_tier = STRATA_TIER_NVME;
  strata_tensor weight;
  CHECK(strata_tensor_register(rt, &desc, &weight));
  static unsigned char initial[1u << 20];
  memset(initial, 0x2a, sizeof initial);
  CHECK(strata_tensor_write(rt, weight, initial, 0, sizeof initial));

  /* One forward layer: acquire on the device, use, release. */
  CHECK(strata_step_begin(rt));
  CHECK(strata_layer_begin(rt, STRATA_PHASE_FORWARD, 0));
  strata_acquired got;
  memset(&got, 0, sizeof got);
  got.struct_size = sizeof got;
  CHECK(strata_acquire(rt, weight, STRATA_TIER_DEVICE, 0, &got));
  /* On CUDA, make the compute stream wait on got.ready_event before using got.data. */
  printf("layer 0 weight resident: %llu bytes%s\n", (unsigned long long)got.bytes,
         got.ready_event ? " (wait on ready_event)" : "");
  CHECK(strata_release(rt, weight, 0, NULL));
  CHECK(strata_layer_end(rt, STRATA_PHASE_FORWARD, 0));
  CHECK(strata_step_end(rt));

  unsigned char check[16];
  CHECK(strata_tensor_read(rt, weight, check, 0, sizeof check));
  printf("read back: %s\n", check[0] == 0x2a && check[15] == 0x2a ? "ok" : "MISMATCH");
  CHECK(strata_tensor_unregister(rt, weight));
  strata_runtime_destroy(rt);
  return check[0] == 0x2a ? 0 : 1;
}
