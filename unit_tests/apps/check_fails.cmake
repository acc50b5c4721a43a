# Runs PROGRAM with ARGS (a ;-list) and requires a non-zero exit and EXPECT (a regex) on stderr.
execute_process(COMMAND ${PROGRAM} ${ARGS} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(status EQUAL 0)
  message(FATAL_ERROR "${PROGRAM} ${ARGS} succeeded; expected it to fail with: ${EXPECT}")
endif()
if(NOT err MATCHES "${EXPECT}")
  message(FATAL_ERROR "expected on stderr: ${EXPECT}\ngot: ${err}")
endif()
