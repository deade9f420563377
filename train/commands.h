// The verbs of the `detr` tool: each takes main's argc/argv (argv[1] is the verb) and returns the
// process exit status (0 ok, 1 failure, 2 bad usage).
#pragma once

int cmd_cocoeval(int argc, char **argv);
int cmd_step(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_pretrain(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_predict(int argc, char **argv);
int cmd_info(int argc, char **argv);
