// The verbs of the `detr` tool: each takes main's argc/argv (argv[1] is the verb) and returns the
// process exit status (0 ok, 1 failure, 2 bad usage).
#pragma once
#include "dist/dist.h"

int cmd_cocoeval(int argc, char **argv, const Dist *job);
int cmd_step(int argc, char **argv, const Dist *job);
int cmd_train(int argc, char **argv, const Dist *job);
int cmd_pretrain(int argc, char **argv, const Dist *job);
int cmd_eval(int argc, char **argv, const Dist *job);
int cmd_synth(int argc, char **argv, const Dist *job);
int cmd_predict(int argc, char **argv, const Dist *job);
int cmd_info(int argc, char **argv, const Dist *job);
int cmd_export(int argc, char **argv, const Dist *job);
