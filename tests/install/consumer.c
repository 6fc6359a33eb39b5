/* A program outside the Strata tree, built against an installed Strata only: the header and the
 * library found through find_package(strata) or pkg-config. It checks that the version is the one
 * installed and makes one real round trip: a runtime on a scratch directory, a tensor on NVMe
 * written and read back, the runtime destroyed (which removes its swap file).
 * Usage: consumer EXPECTED_VERSION NVME_DIR */
#include <stdio.h>
#include <strata/strata.h>
#include <string.h>

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s EXPECTED_VERSION NVME_DIR\n", argv[0]);
    return 2;
  }
  if (strcmp(strata_version(), argv[1]) != 0) {
    fprintf(stderr, "strata_version() is %s, expected %s\n", strata_version(), argv[1]);
    return 1;
  }
  strata_config config;
  strata_config_init(&config);
  config.nvme_path = argv[2];
  config.nvme_capacity_bytes = 16u << 20;
  config.pinned_budget_bytes = 4u << 20;
  config.device_budget_bytes = 4u << 20;
  strata_runtime* rt = NULL;
  int rc = strata_runtime_create(&config, &rt);
  if (rc != STRATA_OK) {
    fprintf(stderr, "strata_runtime_create: %s (%s)\n", strata_strerror(rc),
            strata_last_error(NULL));
    return 1;
  }
  strata_tensor_desc desc;
  memset(&desc, 0, sizeof desc);
  desc.struct_size = sizeof desc;
  desc.name = "consumer.weight";
  desc.bytes = 1u << 16;
  desc.dtype = STRATA_DTYPE_U8;
  desc.kind = STRATA_KIND_PARAMETER;
  desc.home_tier = STRATA_TIER_NVME;
  static unsigned char written[1u << 16], read_back[1u << 16];
  for (size_t i = 0; i < sizeof written; ++i) written[i] = (unsigned char)(i * 7 + 3);
  strata_tensor tensor;
  rc = strata_tensor_register(rt, &desc, &tensor);
  if (rc == STRATA_OK) rc = strata_tensor_write(rt, tensor, written, 0, sizeof written);
  if (rc == STRATA_OK) rc = strata_tensor_read(rt, tensor, read_back, 0, sizeof read_back);
  if (rc != STRATA_OK) {
    fprintf(stderr, "round trip: %s (%s)\n", strata_strerror(rc), strata_last_error(rt));
    strata_runtime_destroy(rt);
    return 1;
  }
  const int same = memcmp(written, read_back, sizeof written) == 0;
  strata_runtime_destroy(rt);
  printf("strata %s: round trip %s\n", strata_version(), same ? "ok" : "MISMATCH");
  return same ? 0 : 1;
}
