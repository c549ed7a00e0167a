/* The nn engine's header is public: include/tide_nn.h (installed with
 * tide.h). This name stays so the engine's own files keep their include. */
#include "tide_nn.h"
