# Writes the detr(1) man page from the built tool's own help texts: `detr help` and `detr help VERB`
# (which prints exactly `detr VERB --help`), so the page cannot disagree with --help.
#   cmake -DDETR=path/to/detr -DOUT=detr.1 -DVERSION=0.4.0 -P tools/man_page.cmake
foreach(var DETR OUT VERSION)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "man_page.cmake: -D${var}=... is required")
  endif()
endforeach()

function(help_text out)
  execute_process(COMMAND ${DETR} help ${ARGN} OUTPUT_VARIABLE text RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "man_page.cmake: '${DETR} help ${ARGN}' exited ${rc}")
  endif()
  # roff: a backslash is \e; a line starting with . or ' would be a request.
  string(REPLACE "\\" "\\e" text "${text}")
  string(REGEX REPLACE "(^|\n)([.'])" "\\1\\\\&\\2" text "${text}")
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

help_text(overview)
# The verbs: the lines "  NAME  summary" of the overview, but help and version (no options).
string(REGEX MATCHALL "\n  [a-z]+ " lines "${overview}")
set(page ".TH DETR 1 \"\" \"detr-c ${VERSION}\" \"User Commands\"
.SH NAME
detr \\- train, evaluate and run DETR object detectors (detr-c)
.SH SYNOPSIS
.B detr
\\fICOMMAND\\fR [\\fIOPTIONS\\fR]
.br
.B detr help
\\fICOMMAND\\fR
.SH DESCRIPTION
.nf
${overview}.fi
.SH COMMANDS
Each section is the output of \\fBdetr help\\fR \\fICOMMAND\\fR, which is that of \\fBdetr\\fR \\fICOMMAND\\fR \\fB\\-\\-help\\fR.
")
foreach(line ${lines})
  string(STRIP "${line}" verb)
  if(verb STREQUAL "help" OR verb STREQUAL "version")
    continue()
  endif()
  help_text(text ${verb})
  string(APPEND page ".SS ${verb}\n.nf\n${text}.fi\n")
endforeach()
string(APPEND page ".SH EXIT STATUS
0 on success, 1 when a file or the data is bad (the message names it), 2 for bad usage.
.SH SEE ALSO
The C library for detection, \\fBdetr.h\\fR (\\fBpkg-config \\-\\-cflags \\-\\-libs detr\\fR), and the
documents installed with it: README.md, library.md, training.md.
")
file(WRITE ${OUT} "${page}")
