#define _DEFAULT_SOURCE  // strtok_r
// key=value model config files (cli/setup.c setup_model_config -> api/model_file.c -> nn/config.c: # comments,
// blank lines, every DetrConfig field, encoder_attn=NAME, NAME=true|false and the attention
// variants' settings), as `--config FILE` reads them; the same lines as --set overrides; and the
// round trip of an accepted config through detr_config_format (the text checkpoints store).
#include <stdlib.h>
#include <string.h>

#include "cli/setup.h"
#include "core/runtime.h"
#include "fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_write_file("model.conf", data, size);
  DetrConfig cfg, again;
  char err[2048] = "";
  if (setup_model_config(path, NULL, &cfg, err, sizeof err) == 0) {
    char text[8192], text2[8192];
    detr_config_format(&cfg, text, sizeof text);
    const char *path2 = fuzz_write_file("formatted.conf", (const uint8_t *)text, strlen(text));
    FUZZ_ASSERT(setup_model_config(path2, NULL, &again, err, sizeof err) == 0, "formatted config refused: %s\n%s", err,
                text);
    detr_config_format(&again, text2, sizeof text2);
    FUZZ_ASSERT(!strcmp(text, text2), "format -> parse -> format differs:\n%s\n---\n%s", text, text2);
  } else {
    // Errors name the file and line ("FILE:LINE: ...") or say which field is out of range.
    FUZZ_ASSERT(err[0], "a refused config got no message");
    FUZZ_ASSERT(strstr(err, path) || !strncmp(err, "config: ", 8), "the message names neither the file nor a field: %s",
                err);
  }

  // The same text as --set overrides, one per line (up to CLI_MAX_LIST of them).
  char *copy = malloc(size + 1);
  memcpy(copy, data, size);
  copy[size] = 0;
  CliList sets = {.count = 0};
  for (char *save = NULL, *line = strtok_r(copy, "\n", &save); line && sets.count < CLI_MAX_LIST;
       line = strtok_r(NULL, "\n", &save))
    sets.items[sets.count++] = line;
  detr_config_preset("tiny", &cfg);
  err[0] = 0;
  if (setup_apply_sets(&cfg, &sets, err, sizeof err) == 0) (void)detr_config_validate(&cfg, err, sizeof err);
  free(copy);
  return 0;
}
