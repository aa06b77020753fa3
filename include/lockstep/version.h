// The source revision this binary was built from (git short hash, "-dirty" with uncommitted
// changes), written at build time by cmake/write_revision.cmake.
#pragma once

const char* lockstep_source_revision();
